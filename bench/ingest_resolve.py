"""Scenario 3, 202-to-resolved: ingests at a steady rate while following the change stream
(/v0/changes/stream), and times each Receipt from its 202 to its `receipt.resolved` event;
beside it, the same interval in the journal itself and the stream's delivery lag."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from datetime import datetime
from typing import Any, Callable

import httpx
import psycopg

from contentsvc.bench.ingest_requests import Texts, decode, encode, explain_pending, ingest_command
from contentsvc.bench.service import JSON_HEADERS, Target, api_client
from contentsvc.bench.stats import Errors, latency_summary


class FeedFollower:
    """Reads /v0/changes/stream and notes when each receipt.resolved arrives."""

    def __init__(self, client: httpx.AsyncClient, corpus_id: str,
                 on_resolved: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.corpus_id = corpus_id
        self.on_resolved = on_resolved
        self.resolved_at: dict[str, float] = {}
        self.arrived = asyncio.Event()
        self.live = asyncio.Event()
        self.failure: str | None = None
        self.events = 0
        self.delivery_lag_ms: list[float] = []  # arrival (wall clock) minus the event's committed_at
        self.task: asyncio.Task | None = None

    async def _run(self) -> None:
        try:
            async with self.client.stream("GET", "/v0/changes/stream", params={"corpus_id": self.corpus_id},
                                          timeout=httpx.Timeout(30.0, read=None)) as r:
                if r.status_code != 200:
                    self.failure = f"http_{r.status_code}: {(await r.aread())[:300]!r}"
                    self.live.set()
                    return
                event, data = None, []
                async for line in r.aiter_lines():
                    if line == "":
                        self._dispatch(event, "\n".join(data))
                        event, data = None, []
                    elif line.startswith(":"):
                        continue
                    else:
                        name, _, value = line.partition(":")
                        value = value[1:] if value.startswith(" ") else value
                        if name == "event":
                            event = value
                        elif name == "data":
                            data.append(value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            self.failure = f"{type(exc).__name__}: {exc}"
            self.live.set()

    def _dispatch(self, event: str | None, data: str) -> None:
        now, wall = time.perf_counter(), time.time()
        self.live.set()
        if event == "stream_error":
            self.failure = f"stream_error: {data[:300]}"
        if event != "change" or not data:
            return
        self.events += 1
        body = json.loads(data)
        try:
            committed = datetime.fromisoformat(body["committed_at"].replace("Z", "+00:00")).timestamp()
            self.delivery_lag_ms.append((wall - committed) * 1000)
        except (KeyError, ValueError, AttributeError):
            pass
        if body.get("kind") == "receipt.resolved" and body.get("receipt_id"):
            if body["receipt_id"] not in self.resolved_at:
                self.resolved_at[body["receipt_id"]] = now
                if self.on_resolved:
                    self.on_resolved(body["receipt_id"])
            self.arrived.set()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass


async def bench_resolve(target: Target, texts: Texts, corpus_id: str, run_id: str, rate: float,
                        seconds: float) -> dict[str, Any]:
    n = max(1, int(rate * seconds))
    sent: dict[str, tuple[float, float]] = {}  # receipt_id -> (t_send, t_202)
    errors = Errors()
    mode = "change_stream"
    poll_resolved: dict[str, float] = {}
    consistency: Counter[str] = Counter()
    checks: list[asyncio.Task] = []

    async with api_client(target, 64) as client, api_client(target, 2) as feed_client:

        async def get_now(rid: str) -> None:
            try:
                r = await client.get(f"/v0/ingestion-receipts/{rid}")
            except httpx.HTTPError as exc:
                consistency[type(exc).__name__] += 1
                return
            consistency[r.json().get("state", "?") if r.status_code == 200 else f"http_{r.status_code}"] += 1

        def on_resolved(rid: str) -> None:
            # Read-after-feed: right after the feed says resolved, what does getReceipt say? (first 50)
            if len(checks) < 50:
                checks.append(asyncio.create_task(get_now(rid)))

        feed = FeedFollower(feed_client, corpus_id, on_resolved)
        feed.start()
        try:
            await asyncio.wait_for(feed.live.wait(), timeout=10)
        except asyncio.TimeoutError:
            feed.failure = feed.failure or "no checkpoint within 10 s"
        if feed.failure:
            mode = f"receipt_polling (change stream unavailable: {feed.failure})"
            await feed.stop()

        async def poll_until_resolved(rid: str) -> None:
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline:
                try:
                    r = await client.get(f"/v0/ingestion-receipts/{rid}")
                    if r.status_code == 200 and r.json().get("state") == "resolved":
                        poll_resolved[rid] = time.perf_counter()
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.01)

        async def send(i: int) -> None:
            body = encode(ingest_command(corpus_id, f"{run_id}-l{i}", texts.take()))
            t = time.perf_counter()
            try:
                r = await client.post("/v0/records", content=body, headers=JSON_HEADERS)
            except httpx.HTTPError as exc:
                errors.add(type(exc).__name__, str(exc))
                return
            t202 = time.perf_counter()
            if r.status_code != 202:
                errors.add(f"http_{r.status_code}", r.text)
                return
            rid = decode(r.content)["receipt_id"]
            sent[rid] = (t, t202)
            if mode != "change_stream":
                await poll_until_resolved(rid)

        tasks = []
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i)))
        send_seconds = time.perf_counter() - t0
        await asyncio.gather(*tasks)

        if mode == "change_stream":
            deadline = time.perf_counter() + 60
            while time.perf_counter() < deadline and not all(rid in feed.resolved_at for rid in sent):
                feed.arrived.clear()
                try:
                    await asyncio.wait_for(feed.arrived.wait(), timeout=1.0)
                except asyncio.TimeoutError:
                    if feed.failure:
                        break
            resolved_at = feed.resolved_at
            await asyncio.gather(*checks)
            await feed.stop()
        else:
            resolved_at = poll_resolved

    missing = [rid for rid in sent if rid not in resolved_at]
    diagnostics = await explain_pending(target.database_url, missing[:20]) if missing and target.database_url else None
    server_side = await journal_resolve_latency(target.database_url, corpus_id) if target.database_url else None
    from_202, from_send = [], []
    before_202 = 0
    for rid, (t_send, t_202) in sent.items():
        if rid not in resolved_at:
            continue
        t_res = resolved_at[rid]
        if t_res < t_202:
            before_202 += 1
        from_202.append(max(0.0, t_res - t_202) * 1000)
        from_send.append((t_res - t_send) * 1000)
    return {
        "mode": mode,
        "feed_failure": feed.failure,
        "rate_per_s": rate,
        "requests_planned": n,
        "send_seconds": round(send_seconds, 3),
        "accepted_202": len(sent),
        "errors": errors.report(),
        "resolved_seen": len(from_202),
        "unresolved_after_60s": len(sent) - len(from_202),
        "resolved_event_before_202_seen": before_202,
        "from_202": latency_summary(from_202),
        "from_send": latency_summary(from_send),
        # getReceipt's state read right after each of the first 50 receipt.resolved events arrived.
        "get_receipt_right_after_resolved_event": dict(consistency),
        # Every change event: its arrival on the stream minus its committed_at (same machine's clock when local).
        "stream_delivery_lag": latency_summary(feed.delivery_lag_ms) if feed.delivery_lag_ms else None,
        # In the journal: receipt.resolved committed_at minus ingest.accepted committed_at (no HTTP, no feed).
        "journal_accepted_to_resolved": server_side,
        "unresolved_receipt_ids": missing[:20],
        "diagnostics": diagnostics,
    }


async def journal_resolve_latency(database_url: str, corpus_id: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        rows = await (await conn.execute(
            "SELECT extract(epoch FROM r.committed_at - a.committed_at) * 1000 FROM journal a"
            " JOIN journal r ON r.receipt_id = a.receipt_id AND r.kind = 'receipt.resolved'"
            " WHERE a.kind = 'ingest.accepted' AND a.corpus_id = %s", (corpus_id,))).fetchall()
    return latency_summary([float(r[0]) for r in rows])
