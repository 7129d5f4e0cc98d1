"""Scenario 4, raw journal append: contentsvc.journal.store.append with 1 event per
transaction (1 and RAW_CONCURRENCY connections) and RAW_BATCH events per call, against the
ceiling of a plain durable INSERT of an equivalent row into a table shaped like the journal;
and the ceilings of the single and batch phases: plain durable INSERTs, one row per transaction
on SINGLE_CONCURRENCY connections and RAW_BATCH rows per transaction on BATCH_CONCURRENCY.

Its events are kind RAW_KIND of org RAW_ORG: not public, so no feed shows them, and the
projectors skip the kind."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import psycopg

from contentsvc.bench.driver import BenchError
from contentsvc.bench.ingest_batch import BATCH_CONCURRENCY
from contentsvc.bench.ingest_single import SINGLE_CONCURRENCY
from contentsvc.bench.ingest_requests import Texts
from contentsvc.bench.stats import Errors, latency_summary
from contentsvc.journal.events import IngestAccepted, Source

RAW_CONCURRENCY = 4
RAW_BATCH = 100
RAW_ORG = "bench-raw"
RAW_KIND = "bench.raw"


class RawAccepted(IngestAccepted, kw_only=True, tag=RAW_KIND):
    """An ingest.accepted payload under the bench's own kind, which no projector folds."""


def raw_payload(text: str) -> RawAccepted:
    """Shaped like an ingest.accepted payload with a ~1 KiB text."""
    return RawAccepted(
        receipt_id="rcp_" + uuid.uuid4().hex,
        source=Source(corpus_id="bench-raw", namespace="bench", record_key=uuid.uuid4().hex),
        content={"kind": "text", "text": text},
        provenance={"origin": "client", "accepted_at": datetime.now(timezone.utc).isoformat()},
        accepted_at=datetime.now(timezone.utc).isoformat(),
    )


async def timed_loop(url: str, connections: int, seconds: float, events_per_txn: int,
                     body: Callable[[psycopg.AsyncConnection], Awaitable[None]]) -> dict[str, Any]:
    from contentsvc.journal.store import transaction as journal_transaction

    conns = [await psycopg.AsyncConnection.connect(url, autocommit=True) for _ in range(connections)]
    try:
        for c in conns:
            await c.execute("SET synchronous_commit = on")
        latencies: list[float] = []
        errors = Errors()
        counts = [0] * connections
        start = asyncio.Event()
        deadline = 0.0

        async def run(k: int, conn: psycopg.AsyncConnection) -> None:
            await start.wait()
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                try:
                    async with journal_transaction(conn):  # one flush for the writes and COMMIT
                        await body(conn)
                except psycopg.Error as exc:
                    errors.add(type(exc).__name__, str(exc))
                    continue
                latencies.append((time.perf_counter() - t) * 1000)
                counts[k] += 1

        tasks = [asyncio.create_task(run(k, c)) for k, c in enumerate(conns)]
        t0 = time.perf_counter()
        deadline = t0 + seconds
        start.set()
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    finally:
        for c in conns:
            await c.close()
    txns = sum(counts)
    return {
        "connections": connections,
        "events_per_transaction": events_per_txn,
        "seconds": round(wall, 3),
        "transactions": txns,
        "events": txns * events_per_txn,
        "events_per_s": round(txns * events_per_txn / wall, 1),
        "transaction_latency": latency_summary(latencies),
        "errors": errors.report(),
    }


async def bench_raw(database_url: str, texts: Texts, seconds: float) -> dict[str, Any]:
    from contentsvc.storage import database  # noqa: F401 - jsonb through msgspec, as the service does
    from contentsvc.ids import new_id
    from contentsvc.journal.codec import jsonb_payload
    from contentsvc.journal.events import NewEvent
    from contentsvc.journal.store import append

    pool = [texts.take() for _ in range(64)]
    pick = iter(range(10**12))

    def event() -> NewEvent:
        payload = raw_payload(pool[next(pick) % len(pool)])
        return NewEvent(org_id=RAW_ORG, corpus_id=None, subject_type="bench", subject_id=payload.receipt_id,
                        payload=payload)

    if event().public:
        raise BenchError(f"{RAW_KIND} is a public kind: the raw events would show in the feed")

    async def journal_one(conn) -> None:
        await append(conn, [event()])

    async def journal_batch(conn) -> None:
        await append(conn, [event() for _ in range(RAW_BATCH)])

    table = f"bench_plain_{uuid.uuid4().hex[:8]}"
    insert = (f"INSERT INTO {table} (position, event_id, kind, public, org_id, corpus_id, subject_type,"
              f" subject_id, version_id, receipt_id, payload)"
              f" VALUES (nextval('{table}_seq'), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")

    def plain_row(e: NewEvent) -> tuple:
        return (new_id("evt"), e.kind, e.public, e.org_id, e.corpus_id, e.subject_type, e.subject_id, e.version_id,
                e.receipt_id, jsonb_payload(e.payload))

    async def plain_one(conn) -> None:
        await conn.execute(insert, plain_row(event()))

    async def plain_batch(conn) -> None:
        await conn.cursor().executemany(insert, [plain_row(event()) for _ in range(RAW_BATCH)])

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as admin:
        settings = {}
        for name in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes"):
            settings[name] = (await (await admin.execute(f"SHOW {name}")).fetchone())[0]
        # The ceiling: same columns, defaults and indexes as the journal; no lock, no notify.
        await admin.execute(f"CREATE TABLE {table} (LIKE journal INCLUDING DEFAULTS INCLUDING INDEXES)")
        await admin.execute(f"CREATE SEQUENCE {table}_seq")
        try:
            out: dict[str, Any] = {
                "postgres": settings,
                "plain_table": f"{table} (LIKE journal INCLUDING DEFAULTS INCLUDING INDEXES; dropped after)",
                "note": "the service keeps running: its projectors and API listener wake on each journal NOTIFY"
                        " (they skip bench.raw); the plain INSERT takes no lock and sends no NOTIFY",
            }
            out["journal_1conn"] = await timed_loop(database_url, 1, seconds, 1, journal_one)
            out["plain_1conn"] = await timed_loop(database_url, 1, seconds, 1, plain_one)
            out[f"journal_{RAW_CONCURRENCY}conn"] = await timed_loop(database_url, RAW_CONCURRENCY, seconds, 1,
                                                                     journal_one)
            out[f"plain_{RAW_CONCURRENCY}conn"] = await timed_loop(database_url, RAW_CONCURRENCY, seconds, 1,
                                                                   plain_one)
            out["journal_batch100_1conn"] = await timed_loop(database_url, 1, seconds, RAW_BATCH, journal_batch)
            # The ceilings of the API's own phases, at their concurrency: durable one-row commits
            # (single ingest) and 100-row transactions (batch ingest).
            out[f"plain_{SINGLE_CONCURRENCY}conn"] = await timed_loop(database_url, SINGLE_CONCURRENCY, seconds, 1,
                                                                      plain_one)
            out[f"plain_batch100_{BATCH_CONCURRENCY}conn"] = await timed_loop(database_url, BATCH_CONCURRENCY, seconds,
                                                                          RAW_BATCH, plain_batch)
        finally:
            await admin.execute(f"DROP TABLE IF EXISTS {table}")
            await admin.execute(f"DROP SEQUENCE IF EXISTS {table}_seq")
    for c in ("1conn", f"{RAW_CONCURRENCY}conn"):
        j, p = out[f"journal_{c}"]["events_per_s"], out[f"plain_{c}"]["events_per_s"]
        out[f"ratio_journal_to_plain_{c}"] = round(j / p, 3) if p else None
    return out


def ratios_to_ceilings(single: dict[str, Any], batch: dict[str, Any], raw: dict[str, Any],
                       single_folds_paused: dict[str, Any] | None = None,
                       batch_folds_paused: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each ingest phase's rate over its plain-INSERT ceiling measured in the same run, and over
    the same load sent with the service's folds paused."""
    def ratio(rate: float | None, ceiling: float | None) -> float | None:
        return round(rate / ceiling, 3) if rate and ceiling else None

    plain_commits = raw[f"plain_{SINGLE_CONCURRENCY}conn"]["events_per_s"]
    plain_batches = raw[f"plain_batch100_{BATCH_CONCURRENCY}conn"]["events_per_s"]
    out = {
        "single_to_plain_commits": ratio(single["throughput_req_per_s"], plain_commits),
        "batch_to_plain_100_row_transactions": ratio(batch["records_per_s"], plain_batches),
    }
    if single_folds_paused:
        paused = single_folds_paused["throughput_req_per_s"]
        out["single_folds_paused_to_plain_commits"] = ratio(paused, plain_commits)
        out["single_to_single_folds_paused"] = ratio(single["throughput_req_per_s"], paused)
    if batch_folds_paused:
        paused = batch_folds_paused["records_per_s"]
        out["batch_folds_paused_to_plain_100_row_transactions"] = ratio(paused, plain_batches)
        out["batch_to_batch_folds_paused"] = ratio(batch["records_per_s"], paused)
    return out
