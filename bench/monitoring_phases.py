"""The three measurements of `contentsvc bench monitoring`, read from the service's database (the
evaluations and Deliveries the workers write) and from the bench's receiver (what arrived, when).

1. evaluation throughput: N SciFact documents ingested at once (batches of 100); decisions are
   (Version, Subscription) evaluations settled (decided or failed), counted every POLL_S as those
   the monitor armed (each Version it folded as made current, times the Subscriptions, which all
   pin the bench's Corpora) less those still pending in `monitor_evaluations`; the rate over the
   whole span (first to last settled) and over its middle (10 % to 90 % of the decisions, the
   steady state without the start and the tail).
2. latency: documents ingested one by one at a steady rate; for every `match.created` webhook,
   arrival at the receiver minus the 202 of its Record's ingest at the client.
3. delivery throughput: the Records of phase 1 withdrawn at once, which gives each of their
   active Matches a `match.withdrawn` Delivery in the monitor's fold (no evaluator call), so the
   deliveries worker has a backlog: deliveries over the span from the first to the last arrival.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import httpx
import psycopg

from contentsvc.bench.driver import BenchError
from contentsvc.bench.monitoring_receiver import Receiver
from contentsvc.bench.monitoring_workload import text_of
from contentsvc.bench.stats import latency_summary, percentile

POLL_S = 0.25
BATCH = 100
INGEST_CONCURRENCY = 4


def entry(corpus_id: str, doc: dict[str, str]) -> dict[str, Any]:
    return {"idempotency_key": uuid.uuid4().hex,
            "source": {"corpus_id": corpus_id, "namespace": "scifact", "record_key": doc["_id"]},
            "title": doc["title"] or None, "content": {"kind": "text", "text": text_of(doc)}}


async def ingest_batches(client: httpx.AsyncClient, corpus_id: str, docs: list[dict[str, str]]) -> None:
    gate = asyncio.Semaphore(INGEST_CONCURRENCY)

    async def send(chunk):
        async with gate:
            r = await client.post("/v0/records/batch", json={"entries": [entry(corpus_id, d) for d in chunk]})
        if r.status_code != 200 or any(item["status"] != 202 for item in r.json()["items"]):
            raise BenchError(f"batch ingest: {r.status_code} {r.text[:300]}")

    await asyncio.gather(*(send(docs[i:i + BATCH]) for i in range(0, len(docs), BATCH)))


async def evaluation_counts(conn: psycopg.AsyncConnection, corpus_id: str, subscriptions: int) -> dict[str, int]:
    """Evaluations armed (the Corpus's Versions made current up to the monitor's trigger mark, each
    armed once per Subscription), still pending, and so settled: a settled one leaves the table."""
    made_current, pending = await (await conn.execute(
        "SELECT (SELECT count(*) FROM journal j WHERE j.org_id = c.org_id AND j.corpus_id = c.corpus_id AND j.public"
        "        AND j.kind = 'record.availability_changed' AND j.position <= (SELECT position FROM monitor_trigger_mark)"
        "        AND j.payload @> '{\"is_current\": true, \"searchable\": true}'),"
        "       (SELECT count(*) FROM monitor_evaluations e WHERE e.corpus_id = c.corpus_id)"
        " FROM corpora c WHERE c.corpus_id = %s", (corpus_id,))).fetchone()
    triggered = made_current * subscriptions
    return {"triggered": triggered, "pending": pending, "settled": triggered - pending}


async def pending_deliveries(conn: psycopg.AsyncConnection, corpus_id: str) -> int:
    return (await (await conn.execute("SELECT count(*) FROM deliveries WHERE corpus_id = %s AND state = 'pending'",
                                      (corpus_id,))).fetchone())[0]


async def settle(conn: psycopg.AsyncConnection, corpus_id: str, subscriptions: int, expected: int,
                 cap_s: float) -> list[tuple]:
    """(seconds, settled, pending) every POLL_S until `expected` evaluations are settled or cap_s passes."""
    t0 = time.perf_counter()
    samples = []
    while True:
        c = await evaluation_counts(conn, corpus_id, subscriptions)
        settled = c["settled"]
        samples.append((time.perf_counter() - t0, settled, c["pending"]))
        if settled >= expected or time.perf_counter() - t0 > cap_s:
            return samples
        await asyncio.sleep(POLL_S)


def rate_between(samples: list[tuple], low: float, high: float) -> float | None:
    """Decisions per second between the first samples reaching `low` and `high` settled."""
    a = next((s for s in samples if s[1] >= low), None)
    b = next((s for s in samples if s[1] >= high), None)
    if a is None or b is None or b[0] <= a[0]:
        return None
    return (b[1] - a[1]) / (b[0] - a[0])


async def drain_deliveries(conn: psycopg.AsyncConnection, corpus_id: str, cap_s: float) -> int:
    deadline = time.perf_counter() + cap_s
    while (left := await pending_deliveries(conn, corpus_id)) and time.perf_counter() < deadline:
        await asyncio.sleep(POLL_S)
    return left


async def wait_triggered(conn: psycopg.AsyncConnection, corpus_id: str, subscriptions: int, expected: int,
                         cap_s: float) -> None:
    deadline = time.perf_counter() + cap_s
    while (await evaluation_counts(conn, corpus_id, subscriptions))["triggered"] < expected:
        if time.perf_counter() > deadline:
            raise BenchError(f"{corpus_id}: fewer than {expected} evaluations triggered after {cap_s:.0f} s")
        await asyncio.sleep(POLL_S)


async def warm_up(client, conn, corpus_id: str, docs: list[dict[str, str]], subscriptions: int) -> None:
    """A few Versions evaluated and delivered first: the plan read, the evaluator's connection open."""
    await ingest_batches(client, corpus_id, docs)
    samples = await settle(conn, corpus_id, subscriptions, len(docs) * subscriptions, 120.0)
    if samples[-1][1] < len(docs) * subscriptions:
        raise BenchError(f"warm-up: {samples[-1][1]} of {len(docs) * subscriptions} evaluations settled in 120 s")
    await drain_deliveries(conn, corpus_id, 60.0)


def arrivals_of(receiver: Receiver, corpus_id: str, event_type: str, since: int = 0) -> list[tuple[float, dict]]:
    out = []
    for a in receiver.arrivals[since:]:
        body = json.loads(a.body)
        if body.get("corpus_id") == corpus_id and body.get("type") == event_type:
            out.append((a.arrived, body))
    return out


async def evaluation_throughput(client, conn, receiver: Receiver, corpus_id: str, docs: list[dict[str, str]],
                                subscriptions: int, dedup_ratio: float, cap_s: float) -> dict[str, Any]:
    expected = len(docs) * subscriptions
    mark = len(receiver.arrivals)
    t0 = time.perf_counter()
    await ingest_batches(client, corpus_id, docs)
    accepted_s = time.perf_counter() - t0
    samples = await settle(conn, corpus_id, subscriptions, expected, cap_s)
    counts = await evaluation_counts(conn, corpus_id, subscriptions)
    settled = counts["settled"]
    first = next((s for s in samples if s[1] > 0), None)
    last = next((s for s in samples if s[1] >= settled), samples[-1])
    span = None if first is None else last[0] - first[0] + POLL_S  # the first sample saw up to POLL_S of work
    whole = settled / span if span else None
    middle = rate_between(samples, 0.1 * expected, 0.9 * expected)
    matches = (await (await conn.execute("SELECT count(*) FROM matches WHERE corpus_id = %s",
                                         (corpus_id,))).fetchone())[0]
    failing = (await (await conn.execute("SELECT count(*) FROM monitor_subscription_status"
                                         " WHERE last_error IS NOT NULL")).fetchone())[0]
    left = await drain_deliveries(conn, corpus_id, 60.0)
    created = arrivals_of(receiver, corpus_id, "match.created", mark)
    delivered = None
    if len(created) > 1:
        delivered = round(len(created) / (created[-1][0] - created[0][0]), 1)
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {
        "versions": len(docs), "subscriptions": subscriptions, "expected_decisions": expected,
        "settled_decisions": settled, "still_pending_at_cap": counts["pending"],
        "subscriptions_with_evaluation_error": failing,
        "ingests_accepted_s": round(accepted_s, 2),
        "first_to_last_settled_s": r(span),
        "decisions_per_s": r(whole),
        "decisions_per_s_10_to_90pct": r(middle),
        "evaluator_evaluations_per_s": r(None if whole is None else whole / dedup_ratio),
        "max_pending": max(s[2] for s in samples),
        "matches": matches, "match_share_pct": round(100 * matches / max(1, settled), 2),
        "match_created_received": len(created), "deliveries_not_sent_after_drain": left,
        "match_created_deliveries_per_s_while_evaluating": delivered,
        "capped": settled < expected,
    }


async def latency(client, conn, receiver: Receiver, corpus_id: str, docs: list[dict[str, str]], rate: float,
                  seconds: float, subscriptions: int, drain_cap_s: float) -> dict[str, Any]:
    """One POST /v0/records every 1/rate s for `seconds`; each 202's arrival time by record key."""
    accepted: dict[str, float] = {}
    errors: list[str] = []
    mark = len(receiver.arrivals)

    async def send(doc):
        r = await client.post("/v0/records", json=entry(corpus_id, doc))
        if r.status_code == 202:
            accepted[doc["_id"]] = time.time()
        else:
            errors.append(f"{r.status_code} {r.text[:200]}")

    count = min(len(docs), int(rate * seconds))
    tasks = []
    start = time.perf_counter()
    for n in range(count):
        await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(send(docs[n])))
    await asyncio.gather(*tasks)
    sent_s = time.perf_counter() - start
    await wait_triggered(conn, corpus_id, subscriptions, len(accepted) * subscriptions, drain_cap_s)
    samples = await settle(conn, corpus_id, subscriptions, len(accepted) * subscriptions, drain_cap_s)
    left = await drain_deliveries(conn, corpus_id, drain_cap_s)
    keys = dict(await (await conn.execute("SELECT record_id, record_key FROM records WHERE corpus_id = %s",
                                          (corpus_id,))).fetchall())
    matches = (await (await conn.execute("SELECT count(*) FROM matches WHERE corpus_id = %s",
                                         (corpus_id,))).fetchone())[0]
    every: list[float] = []
    per_record: dict[str, list[float]] = {}
    for arrived, body in arrivals_of(receiver, corpus_id, "match.created", mark):
        ms = (arrived - accepted[keys[body["record_id"]]]) * 1000
        every.append(ms)
        per_record.setdefault(body["record_id"], []).append(ms)
    return {
        "rate_per_s": rate, "seconds": seconds, "ingested": len(accepted), "ingest_errors": errors[:5],
        "sending_took_s": round(sent_s, 1), "settled_decisions": samples[-1][1],
        "max_pending_evaluations": max(s[2] for s in samples),
        "matches": matches, "webhooks_received": len(every), "matching_records": len(per_record),
        "deliveries_not_sent_after_drain": left,
        "every_webhook": latency_summary(every),
        "first_webhook_per_record": latency_summary([min(v) for v in per_record.values()]),
        "last_webhook_per_record": latency_summary([max(v) for v in per_record.values()]),
    }


async def delivery_throughput(client, conn, receiver: Receiver, corpus_id: str, docs: list[dict[str, str]],
                              cap_s: float) -> dict[str, Any]:
    expected = (await (await conn.execute("SELECT count(*) FROM matches WHERE corpus_id = %s AND state = 'active'",
                                          (corpus_id,))).fetchone())[0]
    mark = len(receiver.arrivals)
    gate = asyncio.Semaphore(8)

    async def withdraw(doc):
        async with gate:
            r = await client.post("/v0/records/withdrawals", json={
                "idempotency_key": uuid.uuid4().hex,
                "source": {"corpus_id": corpus_id, "namespace": "scifact", "record_key": doc["_id"]}})
        if r.status_code != 202:
            raise BenchError(f"withdrawal: {r.status_code} {r.text[:300]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(withdraw(d) for d in docs))
    withdrawn_s = time.perf_counter() - t0
    backlog = 0
    deadline = time.perf_counter() + cap_s
    while time.perf_counter() < deadline:
        got = len(arrivals_of(receiver, corpus_id, "match.withdrawn", mark))
        backlog = max(backlog, await pending_deliveries(conn, corpus_id))
        if got >= expected:
            break
        await asyncio.sleep(POLL_S)
    withdrawn = arrivals_of(receiver, corpus_id, "match.withdrawn", mark)
    times = [a for a, _ in withdrawn]
    span = times[-1] - times[0] if len(times) > 1 else None
    gaps = [(b - a) * 1000 for a, b in zip(times, times[1:])]
    return {
        "records_withdrawn": len(docs), "withdrawals_accepted_s": round(withdrawn_s, 2),
        "expected_deliveries": expected, "received": len(withdrawn),
        "first_to_last_arrival_s": None if span is None else round(span, 2),
        "deliveries_per_s": None if not span else round(len(withdrawn) / span, 1),
        "max_pending_deliveries_seen": backlog,
        "arrival_gap_p99_ms": None if not gaps else round(percentile(gaps, 99), 2),
    }
