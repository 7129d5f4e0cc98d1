"""`contentsvc bench ingest`: ingest throughput, latency, and the journal's raw append rate.

Usage:
    contentsvc bench ingest [--url URL --api-key KEY] [--database-url URL] [--seconds N]
                            [--single N] [--batches N] [--rate R]

Against a running service when --url and --api-key (or CONTENTSVC_URL and
CONTENTSVC_API_KEY) are given; the raw journal figures then need
--database-url (that service's database) and are skipped without it.
Otherwise the bench starts its own service: a fresh database on the server
of CONTENTSVC_DATABASE_URL (else CONTENTSVC_TEST_DATABASE_URL, else an
embedded PostgreSQL in a temporary directory), `python -m contentsvc.cli run`
on a free port with its output in bench/results/ingest-server.log, and an
all-actions key; it stops the service and drops the database at the end.

Measurements (one run, one database):
  1. single ingest: POST /v0/records, concurrency 16, --single requests.
  2. batch ingest: POST /v0/records/batch, 100 entries each, concurrency 4, --batches batches.
  3. 202-to-resolved: --rate ingests per second for 2 x --seconds, each Receipt's
     `receipt.resolved` event followed on the change stream (/v0/changes/stream).
  4. raw journal append (contentsvc.journal.store.append, 1 event per transaction,
     1 and 4 connections, and 100 events per call) against the ceiling of a plain
     durable INSERT of an equivalent row into a table shaped like the journal;
     --seconds each. Its events are kind "bench.raw" of org "bench-raw": not
     public, so no feed shows them, and the projectors skip the kind.

Only 202 answers (and 202 batch items) count as successes; every other answer,
timeout or transport error is counted and reported. The figures are written to
bench/results/ingest.json with the targets and whether each was met; nothing
here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import msgspec
import psycopg

from contentsvc.journal.events import IngestAccepted, Source
from contentsvc.processes.local_service import LocalService, create_database, drop_database
from contentsvc.search.vector_index import engine_vectors_enabled

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_PATH = RESULTS_DIR / "ingest.json"
SERVER_LOG = RESULTS_DIR / "ingest-server.log"
DEFAULT_CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "scifact" / "corpus.jsonl"

TEXT_BYTES = 1024
SINGLE_CONCURRENCY = 16
BATCH_SIZE = 100
BATCH_CONCURRENCY = 4
RAW_CONCURRENCY = 4
RAW_BATCH = 100
PHASE_CAP_S = 60.0  # no HTTP phase runs longer than this, whatever the counts
DRAIN_CAP_S = 45.0  # how long to wait for the projectors to resolve a phase's Receipts
RAW_ORG = "bench-raw"
RAW_KIND = "bench.raw"

TARGETS = {
    "batch_records_per_s": {"op": ">=", "value": 3000, "unit": "records/s"},
    "single_p99_ms": {"op": "<=", "value": 30, "unit": "ms"},
    "resolve_p50_ms": {"op": "<=", "value": 300, "unit": "ms"},
}


class BenchError(RuntimeError):
    pass


# --------------------------------------------------------------------------- texts


class Texts:
    """~1 KiB texts from the corpus (title + text, padded with the following
    documents, cut at TEXT_BYTES on a character boundary), taken in a cycle."""

    def __init__(self, path: Path, size: int = TEXT_BYTES) -> None:
        docs = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    docs.append(f"{d.get('title', '')}\n\n{d.get('text', '')}".strip())
        if not docs:
            raise BenchError(f"no documents in {path}")
        self.texts = []
        for i in range(len(docs)):
            raw, j = b"", i
            while len(raw) < size:
                raw += (docs[j % len(docs)] + "\n\n").encode()
                j += 1
            self.texts.append(raw[:size].decode("utf-8", errors="ignore"))
        self.next = 0

    def take(self) -> str:
        text = self.texts[self.next % len(self.texts)]
        self.next += 1
        return text


# --------------------------------------------------------------------------- stats


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def latency_summary(values_ms: list[float]) -> dict[str, Any]:
    r = lambda v: None if v is None else round(v, 2)  # noqa: E731
    return {
        "count": len(values_ms),
        "p50_ms": r(percentile(values_ms, 50)),
        "p95_ms": r(percentile(values_ms, 95)),
        "p99_ms": r(percentile(values_ms, 99)),
        "max_ms": r(max(values_ms) if values_ms else None),
        "mean_ms": r(sum(values_ms) / len(values_ms) if values_ms else None),
    }


class Errors:
    """Non-success answers by kind, with a few samples."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []

    def add(self, kind: str, detail: str = "") -> None:
        self.counts[kind] += 1
        if len(self.samples) < 5:
            self.samples.append(f"{kind}: {detail[:300]}")

    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> dict[str, Any]:
        return {"total": self.total(), "by_kind": dict(self.counts), "samples": self.samples}


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


# --------------------------------------------------------------------------- the service


@dataclass
class Target:
    base_url: str
    api_key: str
    database_url: str | None
    own: bool


class OwnService:
    """A fresh database (on CONTENTSVC_DATABASE_URL's server, else CONTENTSVC_TEST_DATABASE_URL's,
    else an embedded PostgreSQL) and `contentsvc run` on it, as the tests start one."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.admin_url: str | None = None
        self.database_url: str | None = None
        self.service: LocalService | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._home = tempfile.TemporaryDirectory(prefix="contentsvc-bench-home-")

    @property
    def process(self):
        return self.service.process

    def _admin(self) -> str:
        url = os.environ.get("CONTENTSVC_DATABASE_URL") or os.environ.get("CONTENTSVC_TEST_DATABASE_URL")
        if url:
            return url
        from contentsvc.storage.database import start_embedded

        self._tmp = tempfile.TemporaryDirectory(prefix="contentsvc-bench-pg-")
        return start_embedded(Path(self._tmp.name))

    def start(self, home: Path | None = None) -> Target:
        self.admin_url = self._admin()
        self.database_url = create_database(self.admin_url, "csbench")
        try:
            self.service = LocalService(self.database_url, self.log_path, home or Path(self._home.name))
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None

        from contentsvc.auth import keys

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            created = keys.create_key(conn, f"bench-{uuid.uuid4().hex[:8]}", keys.parse_actions("*"), None, "bench")
        return Target(self.service.base_url, created.secret, self.database_url, own=True)

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.database_url and self.admin_url:
            try:
                drop_database(self.admin_url, self.database_url)
            except psycopg.Error as exc:
                print(f"warning: could not drop database {self.database_url}: {exc}", file=sys.stderr)
            self.database_url = None
        if self._tmp is not None:
            from contentsvc.storage import database

            for server in database._embedded_handles:  # stop the embedded server before removing its files
                try:
                    server.cleanup()
                except Exception:
                    pass
            self._tmp.cleanup()
            self._tmp = None
        self._home.cleanup()


def scan_server_log(path: Path) -> dict[str, Any]:
    """Warnings, errors and tracebacks the service wrote during the run."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {"path": str(path), "lines": 0}
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    excerpt = []
    tracebacks = 0
    for line in lines:
        level = None
        if line.startswith("{"):
            try:
                rec = json.loads(line)
                level = rec.get("level")
                if level in ("warning", "error", "critical", "exception"):
                    events[f"{level}:{rec.get('event')}"] += 1
            except ValueError:
                pass
        elif "Traceback" in line:
            tracebacks += 1
            level = "traceback"
        elif any(w in line for w in ("ERROR", "Error", "Exception")):
            level = "error_text"
        if level:
            levels[level] += 1
            if level not in ("info", "debug") and len(excerpt) < 30:
                excerpt.append(line[:400])
    return {"path": str(path), "lines": len(lines), "by_level": dict(levels), "tracebacks": tracebacks,
            "warning_and_error_events": dict(events), "excerpt": excerpt}


# --------------------------------------------------------------------------- HTTP helpers

encode = msgspec.json.encode
decode = msgspec.json.decode
JSON_HEADERS = {"Content-Type": "application/json"}


def ingest_command(corpus_id: str, record_key: str, text: str) -> dict:
    return {
        "idempotency_key": uuid.uuid4().hex,
        "source": {"corpus_id": corpus_id, "namespace": "bench", "record_key": record_key},
        "content": {"kind": "text", "text": text},
    }


def new_client(target: Target, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=target.base_url,
        headers={"Authorization": f"Bearer {target.api_key}"},
        timeout=httpx.Timeout(30.0),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        http1=True, http2=False,
    )


async def create_corpus(client: httpx.AsyncClient, corpus_id: str) -> str:
    r = await client.post("/v0/corpora", content=encode(
        {"idempotency_key": uuid.uuid4().hex, "corpus_id": corpus_id, "name": f"bench {corpus_id}"}),
        headers=JSON_HEADERS)
    if r.status_code not in (200, 201):
        raise BenchError(f"createCorpus {corpus_id}: {r.status_code} {r.text[:500]}")
    return r.json()["corpus_id"]


async def wait_resolved(client: httpx.AsyncClient, receipt_ids: list[str], cap_s: float,
                        database_url: str | None = None) -> dict[str, Any]:
    """Polls the given Receipts (every 50 ms, one at a time) until resolved or cap_s passes.

    Receipts still pending at the cap are counted exactly and, when the
    database is known, explained: their journal events, the receipts rows
    and the projectors' checkpoints against the journal head."""
    t0 = time.perf_counter()
    deadline = t0 + cap_s
    left = list(receipt_ids)
    errors = Errors()

    async def state_of(rid: str) -> str | None:
        try:
            r = await client.get(f"/v0/ingestion-receipts/{rid}")
        except httpx.HTTPError as exc:
            errors.add(type(exc).__name__, str(exc))
            return None
        if r.status_code != 200:
            errors.add(f"http_{r.status_code}", r.text)
            return None
        return r.json().get("state")

    while left and time.perf_counter() < deadline:
        if await state_of(left[0]) == "resolved":
            left.pop(0)
        else:
            await asyncio.sleep(0.05)
    waited = time.perf_counter() - t0
    if left:  # at the cap: which of the remaining ones are really still pending?
        left = [rid for rid in left if await state_of(rid) != "resolved"]
    out = {"checked": len(receipt_ids), "unresolved": len(left), "seconds": round(waited, 3),
           "poll_errors": errors.report()}
    if left:
        out["unresolved_receipt_ids"] = left[:20]
        if database_url:
            out["diagnostics"] = await explain_pending(database_url, left[:20])
    return out


async def explain_pending(database_url: str, receipt_ids: list[str]) -> dict[str, Any]:
    try:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            head = (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]
            checkpoints = await (await conn.execute(
                "SELECT name, position, updated_at::text FROM projector_checkpoints ORDER BY name")).fetchall()
            receipts = await (await conn.execute(
                "SELECT receipt_id, state, outcome FROM receipts WHERE receipt_id = ANY(%s)", (receipt_ids,))).fetchall()
            events = await (await conn.execute(
                "SELECT receipt_id, position, kind, committed_at::text FROM journal WHERE receipt_id = ANY(%s)"
                " ORDER BY position", (receipt_ids,))).fetchall()
    except psycopg.Error as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"journal_head": head, "checkpoints": [list(c) for c in checkpoints],
            "receipts_rows": [list(r) for r in receipts], "journal_events": [list(e) for e in events]}


# --------------------------------------------------------------------------- 1. single ingest


@dataclass
class ClosedLoop:
    sent: int
    wall: float
    cpu: float
    errors: "Errors"
    status: Counter

    def status_counts(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.status.items())}


async def closed_loop(client: httpx.AsyncClient, path: str, bodies: list[bytes], concurrency: int, ok_status: int,
                      answered: Callable[[float, httpx.Response], None]) -> ClosedLoop:
    """POST the bodies with `concurrency` workers, each sending its next body when the last is
    answered, for at most PHASE_CAP_S; `answered(latency_ms, response)` for each ok_status answer."""
    errors, status = Errors(), Counter()
    cursor = 0
    deadline = time.perf_counter() + PHASE_CAP_S

    async def worker() -> None:
        nonlocal cursor
        while cursor < len(bodies) and time.perf_counter() < deadline:
            body = bodies[cursor]
            cursor += 1
            t = time.perf_counter()
            try:
                r = await client.post(path, content=body, headers=JSON_HEADERS)
            except httpx.HTTPError as exc:
                errors.add(type(exc).__name__, str(exc))
                continue
            elapsed = (time.perf_counter() - t) * 1000
            status[r.status_code] += 1
            if r.status_code == ok_status:
                answered(elapsed, r)
            else:
                errors.add(f"http_{r.status_code}", r.text)

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ClosedLoop(cursor, time.perf_counter() - t0, cpu_seconds() - cpu0, errors, status)


async def bench_single(target: Target, texts: Texts, corpus_id: str, run_id: str, n: int) -> dict[str, Any]:
    async with new_client(target, SINGLE_CONCURRENCY) as client:
        # Warm-up: open the keep-alive connections (not counted).
        warm = [encode(ingest_command(corpus_id, f"{run_id}-w{i}", texts.take())) for i in range(SINGLE_CONCURRENCY * 2)]
        await asyncio.gather(*(client.post("/v0/records", content=b, headers=JSON_HEADERS) for b in warm),
                             return_exceptions=True)

        bodies = [encode(ingest_command(corpus_id, f"{run_id}-s{i}", texts.take())) for i in range(n)]
        latencies: list[float] = []
        receipts: list[str] = []

        def accepted(elapsed: float, r: httpx.Response) -> None:
            latencies.append(elapsed)
            receipts.append(decode(r.content)["receipt_id"])

        loop = await closed_loop(client, "/v0/records", bodies, SINGLE_CONCURRENCY, 202, accepted)
        drain = await wait_resolved(client, receipts[-SINGLE_CONCURRENCY * 2:], DRAIN_CAP_S, target.database_url)

    return {
        "requests_planned": n,
        "requests_sent": loop.sent,
        "capped_at_s": PHASE_CAP_S if loop.sent < n else None,
        "concurrency": SINGLE_CONCURRENCY,
        "accepted_202": len(latencies),
        "errors": loop.errors.report(),
        "status_counts": loop.status_counts(),
        "seconds": round(loop.wall, 3),
        "throughput_req_per_s": round(len(latencies) / loop.wall, 1) if loop.wall else None,
        "latency": latency_summary(latencies),
        "client_cpu_s": round(loop.cpu, 2),
        "drain_after_phase": drain,
    }


# --------------------------------------------------------------------------- 2. batch ingest


async def bench_batch(target: Target, texts: Texts, corpus_id: str, run_id: str, batches: int) -> dict[str, Any]:
    bodies = []
    for b in range(batches):
        entries = [ingest_command(corpus_id, f"{run_id}-b{b}-{i}", texts.take()) for i in range(BATCH_SIZE)]
        bodies.append(encode({"entries": entries}))
    latencies: list[float] = []
    last_receipts: list[str] = []
    item_errors = Errors()
    accepted = 0

    async with new_client(target, BATCH_CONCURRENCY) as client:
        # Warm-up: one small batch per connection (not counted).
        warm = [encode({"entries": [ingest_command(corpus_id, f"{run_id}-bw{c}-{i}", texts.take()) for i in range(5)]})
                for c in range(BATCH_CONCURRENCY)]
        await asyncio.gather(*(client.post("/v0/records/batch", content=w, headers=JSON_HEADERS) for w in warm),
                             return_exceptions=True)

        def answered(elapsed: float, r: httpx.Response) -> None:
            nonlocal accepted
            items = decode(r.content)["items"]
            ok = [it for it in items if it.get("status") == 202 and it.get("receipt")]
            for it in items:
                if it.get("status") != 202:
                    item_errors.add(f"item_{it.get('status')}", json.dumps(it.get("error")))
            accepted += len(ok)
            latencies.append(elapsed)
            if ok:
                last_receipts.append(ok[-1]["receipt"]["receipt_id"])

        loop = await closed_loop(client, "/v0/records/batch", bodies, BATCH_CONCURRENCY, 200, answered)
        drain = await wait_resolved(client, last_receipts, DRAIN_CAP_S, target.database_url)

    end_to_end = loop.wall + drain["seconds"]
    return {
        "batches_planned": batches,
        "batches_sent": loop.sent,
        "capped_at_s": PHASE_CAP_S if loop.sent < batches else None,
        "batch_size": BATCH_SIZE,
        "concurrency": BATCH_CONCURRENCY,
        "batches_ok_200": len(latencies),
        "records_accepted_202": accepted,
        "errors": loop.errors.report(),
        "item_errors": item_errors.report(),
        "status_counts": loop.status_counts(),
        "seconds": round(loop.wall, 3),
        "records_per_s": round(accepted / loop.wall, 1) if loop.wall else None,
        "batch_latency": latency_summary(latencies),
        "client_cpu_s": round(loop.cpu, 2),
        "drain_after_phase": drain,
        # Accepted and resolved by the projectors, from the first request to the last Receipt resolved.
        "records_resolved_per_s_end_to_end": (round(accepted / end_to_end, 1)
                                              if end_to_end and drain["unresolved"] == 0 else None),
    }


# --------------------------------------------------------------------------- 3. 202-to-resolved


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

    async with new_client(target, 64) as client, new_client(target, 2) as feed_client:

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


# --------------------------------------------------------------------------- 4. raw journal append


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
    from contentsvc.domain.ids import new_id
    from contentsvc.journal.events import NewEvent
    from contentsvc.journal.codec import jsonb_payload
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

    async def plain_one(conn) -> None:
        e = event()
        await conn.execute(insert, (new_id("evt"), e.kind, e.public, e.org_id, e.corpus_id, e.subject_type,
                                    e.subject_id, e.version_id, e.receipt_id, jsonb_payload(e.payload)))

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
        finally:
            await admin.execute(f"DROP TABLE IF EXISTS {table}")
            await admin.execute(f"DROP SEQUENCE IF EXISTS {table}_seq")
    for c in ("1conn", f"{RAW_CONCURRENCY}conn"):
        j, p = out[f"journal_{c}"]["events_per_s"], out[f"plain_{c}"]["events_per_s"]
        out[f"ratio_journal_to_plain_{c}"] = round(j / p, 3) if p else None
    return out


# --------------------------------------------------------------------------- orchestration


async def check_all_resolved(database_url: str, corpora: list[str], cap_s: float = 30.0) -> dict[str, Any]:
    """Every Receipt of the run's corpora, not a sample: all resolved (waiting up to cap_s)?"""
    t0 = time.perf_counter()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        while True:
            pending, total = await (await conn.execute(
                "SELECT count(*) FILTER (WHERE state <> 'resolved'), count(*) FROM receipts"
                " WHERE corpus_id = ANY(%s)", (corpora,))).fetchone()
            if pending == 0 or time.perf_counter() - t0 > cap_s:
                break
            await asyncio.sleep(0.5)
        ids = []
        if pending:
            ids = [r[0] for r in await (await conn.execute(
                "SELECT receipt_id FROM receipts WHERE corpus_id = ANY(%s) AND state <> 'resolved'"
                " ORDER BY receipt_id LIMIT 20", (corpora,))).fetchall()]
    out = {"receipts": total, "not_resolved": pending, "waited_s": round(time.perf_counter() - t0, 2)}
    if ids:
        out["not_resolved_sample"] = ids
        out["diagnostics"] = await explain_pending(database_url, ids)
    return out


async def run_bench(target: Target, texts: Texts, args) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    async with new_client(target, 2) as client:
        r = await client.get("/v0/health")
        if r.status_code != 200:
            raise BenchError(f"health: {r.status_code} {r.text[:300]}")
        ingest_corpus = await create_corpus(client, f"bench-{run_id}")
        latency_corpus = await create_corpus(client, f"bench-{run_id}-lat")

    phases = [
        ("single", lambda: bench_single(target, texts, ingest_corpus, run_id, args.single)),
        ("batch", lambda: bench_batch(target, texts, ingest_corpus, run_id, args.batches)),
        ("resolve", lambda: bench_resolve(target, texts, latency_corpus, run_id, args.rate, 2 * args.seconds)),
    ]
    for name, phase in phases:
        print(f"[bench ingest] {name} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        results[name] = await phase()
        print(f"[bench ingest] {name} done in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)

    if target.database_url:
        results["integrity"] = await check_all_resolved(target.database_url, [ingest_corpus, latency_corpus])
        print("[bench ingest] raw journal append ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        results["raw_journal"] = await bench_raw(target.database_url, texts, args.seconds)
        print(f"[bench ingest] raw done in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    else:
        results["integrity"] = {"skipped": "no database URL"}
        results["raw_journal"] = {"skipped": "no database URL (give --database-url with --url)"}
    results["corpora"] = {"ingest": ingest_corpus, "latency": latency_corpus}
    return results


def judge(results: dict[str, Any]) -> dict[str, Any]:
    measured = {
        "batch_records_per_s": results.get("batch", {}).get("records_per_s"),
        "single_p99_ms": results.get("single", {}).get("latency", {}).get("p99_ms"),
        "resolve_p50_ms": results.get("resolve", {}).get("from_202", {}).get("p50_ms"),
    }
    out = {}
    for name, t in TARGETS.items():
        v = measured[name]
        if v is None:
            verdict = "n/a"
        elif t["op"] == ">=":
            verdict = "pass" if v >= t["value"] else "miss"
        else:
            verdict = "pass" if v <= t["value"] else "miss"
        out[name] = {**t, "measured": v, "result": verdict}
    return out


def problems(report: dict[str, Any]) -> list[str]:
    """What went wrong or looked wrong in this run, in words (the figures are in results)."""
    res, out = report["results"], []
    for name in ("single", "batch", "resolve"):
        ph = res.get(name, {})
        errs = ph.get("errors", {})
        if errs.get("total"):
            out.append(f"{name}: {errs['total']} failed requests {errs['by_kind']}")
        if ph.get("item_errors", {}).get("total"):
            out.append(f"{name}: {ph['item_errors']['total']} batch items not accepted {ph['item_errors']['by_kind']}")
        if ph.get("capped_at_s"):
            out.append(f"{name}: stopped at the {ph['capped_at_s']:.0f} s cap before sending everything")
        drain = ph.get("drain_after_phase") or {}
        if drain.get("unresolved"):
            out.append(f"{name}: {drain['unresolved']}/{drain['checked']} sampled receipts still pending "
                       f"{drain['seconds']:.0f} s after the phase")
    lat = res.get("resolve", {})
    if lat.get("unresolved_after_60s"):
        out.append(f"resolve: {lat['unresolved_after_60s']} receipts without a receipt.resolved event after 60 s")
    if lat.get("feed_failure"):
        out.append(f"resolve: change stream failed: {lat['feed_failure']}")
    pending_after = (lat.get("get_receipt_right_after_resolved_event") or {}).get("pending")
    if pending_after:
        out.append(f"resolve: getReceipt still said pending for {pending_after} receipts read right after their "
                   "receipt.resolved event arrived (the feed announces before the read model shows it)")
    lag = lat.get("stream_delivery_lag") or {}
    if (lag.get("max_ms") or 0) > 1000:
        out.append(f"resolve: a change event reached the stream {lag['max_ms'] / 1000:.1f} s after its commit")
    integ = res.get("integrity", {})
    if integ.get("not_resolved"):
        out.append(f"integrity: {integ['not_resolved']} of {integ['receipts']} receipts never resolved")
    raw = res.get("raw_journal", {})
    for key, m in raw.items():
        if isinstance(m, dict) and m.get("errors", {}).get("total"):
            out.append(f"raw {key}: {m['errors']['total']} failed transactions {m['errors']['by_kind']}")
    log = report.get("server_log") or {}
    bad = {k: v for k, v in (log.get("by_level") or {}).items() if k not in ("info", "debug")}
    if bad:
        out.append(f"server log: {bad} (see {log['path']})")
    return out


def machine_info() -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "nproc": affinity or os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "httpx": httpx.__version__,
        "psycopg": psycopg.__version__,
        "loadavg_start": None,
        "loadavg_end": None,
    }


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        v = f"{v:,.1f}"
    elif isinstance(v, int):
        v = f"{v:,}"
    return f"{v}{unit}"


def summary_text(report: dict[str, Any]) -> str:
    res = report["results"]
    s, b, lat, raw = res["single"], res["batch"], res["resolve"], res["raw_journal"]
    rows: list[tuple[str, str, str]] = []
    rows.append(("single ingest  c=16", f"{fmt(s['throughput_req_per_s'])} req/s",
                 f"p50 {fmt(s['latency']['p50_ms'])}  p95 {fmt(s['latency']['p95_ms'])}  "
                 f"p99 {fmt(s['latency']['p99_ms'])} ms   ok {s['accepted_202']}/{s['requests_sent']}  "
                 f"errors {s['errors']['total']}"))
    rows.append(("  resolved after", f"{fmt(s['drain_after_phase']['seconds'])} s",
                 f"projector drain after singles (unresolved {s['drain_after_phase']['unresolved']}"
                 f"/{s['drain_after_phase']['checked']} checked)"))
    rows.append(("batch x100     c=4", f"{fmt(b['records_per_s'])} rec/s",
                 f"batch p50 {fmt(b['batch_latency']['p50_ms'])}  p99 {fmt(b['batch_latency']['p99_ms'])} ms   "
                 f"ok {b['records_accepted_202']} rec  errors {b['errors']['total']}+{b['item_errors']['total']} items"))
    rows.append(("  accepted+resolved", f"{fmt(b['records_resolved_per_s_end_to_end'])} rec/s",
                 f"projector drain after batches {fmt(b['drain_after_phase']['seconds'])} s "
                 f"(unresolved {b['drain_after_phase']['unresolved']}/{b['drain_after_phase']['checked']} checked)"))
    rows.append((f"202->resolved  {fmt(lat['rate_per_s'])}/s", f"p50 {fmt(lat['from_202']['p50_ms'])} ms",
                 f"p99 {fmt(lat['from_202']['p99_ms'])} ms  (from send: p50 {fmt(lat['from_send']['p50_ms'])} "
                 f"p99 {fmt(lat['from_send']['p99_ms'])})  seen {lat['resolved_seen']}/{lat['accepted_202']}  "
                 f"errors {lat['errors']['total']}  via {lat['mode'].split(' ')[0]}"))
    srv = lat.get("journal_accepted_to_resolved")
    if srv:
        rows.append(("  in the journal", f"p50 {fmt(srv['p50_ms'])} ms",
                     f"p99 {fmt(srv['p99_ms'])} ms  max {fmt(srv['max_ms'])} ms  (ingest.accepted -> receipt.resolved "
                     f"committed_at)"))
    lag = lat.get("stream_delivery_lag")
    if lag:
        rows.append(("  stream delivery lag", f"p50 {fmt(lag['p50_ms'])} ms",
                     f"p99 {fmt(lag['p99_ms'])} ms  max {fmt(lag['max_ms'])} ms  over {lag['count']} change events "
                     f"(arrival - committed_at)"))
    after = lat.get("get_receipt_right_after_resolved_event") or {}
    if after:
        rows.append(("  getReceipt after event", f"{after.get('pending', 0)} pending",
                     f"of {sum(after.values())} read right after their receipt.resolved event arrived"))
    integ = res.get("integrity", {})
    if "receipts" in integ:
        rows.append(("all receipts", f"{integ['not_resolved']} pending",
                     f"of {integ['receipts']} accepted in this run (after waiting {integ['waited_s']} s)"))
    if "skipped" in raw:
        rows.append(("raw journal", "skipped", raw["skipped"]))
    else:
        for key, label in (("journal_1conn", "journal append 1/txn c=1"), ("plain_1conn", "plain INSERT   1/txn c=1"),
                           (f"journal_{RAW_CONCURRENCY}conn", f"journal append 1/txn c={RAW_CONCURRENCY}"),
                           (f"plain_{RAW_CONCURRENCY}conn", f"plain INSERT   1/txn c={RAW_CONCURRENCY}"),
                           ("journal_batch100_1conn", "journal append 100/call c=1")):
            m = raw[key]
            rows.append((label, f"{fmt(m['events_per_s'])} ev/s",
                         f"txn p50 {fmt(m['transaction_latency']['p50_ms'])}  p99 "
                         f"{fmt(m['transaction_latency']['p99_ms'])} ms  errors {m['errors']['total']}"))
        rows.append(("journal/plain", f"c=1 {fmt(raw['ratio_journal_to_plain_1conn'])}",
                     f"c={RAW_CONCURRENCY} {fmt(raw[f'ratio_journal_to_plain_{RAW_CONCURRENCY}conn'])}   "
                     f"(fsync={raw['postgres']['fsync']}, synchronous_commit={raw['postgres']['synchronous_commit']})"))
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    lines = ["", "contentsvc bench ingest  " + report["timestamp"] + f"  ({report['machine']['nproc']} cpu, "
             f"python {report['machine']['python']}, loadavg {report['machine']['loadavg_start']} -> "
             f"{report['machine']['loadavg_end']})", "-" * (w1 + w2 + 70)]
    lines += [f"{a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in rows]
    lines.append("-" * (w1 + w2 + 70))
    for name, t in report["targets"].items():
        lines.append(f"target {name:<22} {t['op']} {t['value']:>5} {t['unit']:<10} measured {fmt(t['measured']):>10}"
                     f"  {t['result'].upper()}")
    for line in report.get("problems", []):
        lines.append(f"PROBLEM: {line}")
    return "\n".join(lines + closing_lines(report, RESULT_PATH))


def closing_lines(report: dict[str, Any], result_path: Path) -> list[str]:
    """The server log's health and where the figures went (the last lines of every summary)."""
    lines = []
    log = report.get("server_log")
    if log:
        lines.append(f"server log {log['path']}: {log['lines']} lines, levels {log.get('by_level', {})}, "
                     f"tracebacks {log.get('tracebacks', 0)}")
    return lines + [f"written {result_path}"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench ingest", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("CONTENTSVC_URL"), help="a running service (else one is started)")
    p.add_argument("--api-key", default=os.environ.get("CONTENTSVC_API_KEY"),
                   help="an all-actions key of that service")
    p.add_argument("--database-url", help="the service's database, for the raw journal figures")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="length of each raw append loop; the 202-to-resolved phase runs twice this (default 5)")
    p.add_argument("--single", type=int, default=3000, help="single ingest requests (default 3000)")
    p.add_argument("--batches", type=int, default=100, help="batches of 100 entries (default 100)")
    p.add_argument("--rate", type=float, default=50.0, help="ingests/s of the 202-to-resolved phase (default 50)")
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="JSONL with _id, title, text")
    args = p.parse_args(argv)
    if bool(args.url) != bool(args.api_key):
        p.error("--url and --api-key go together (or CONTENTSVC_URL and CONTENTSVC_API_KEY)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    for name in ("httpx", "httpcore"):  # the CLI logs at info; one line per request would drown the summary
        logging.getLogger(name).setLevel(logging.WARNING)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    try:
        texts = Texts(args.corpus)
    except (OSError, ValueError, BenchError) as exc:
        print(f"bench ingest: cannot read texts from {args.corpus}: {exc}", file=sys.stderr)
        return 1
    machine = machine_info()
    machine["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    started = datetime.now(timezone.utc)
    own: OwnService | None = None
    t0 = time.perf_counter()
    try:
        if args.url:
            base = args.url.rstrip("/")
            base = base[: -len("/v0")] if base.endswith("/v0") else base
            target = Target(base, args.api_key, args.database_url, own=False)
        else:
            print(f"[bench ingest] starting contentsvc (log: {SERVER_LOG}) ...", file=sys.stderr, flush=True)
            own = OwnService(SERVER_LOG)
            target = own.start()
        results = asyncio.run(run_bench(target, texts, args))
    except BenchError as exc:
        print(f"bench ingest failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if own is not None:
            own.stop()
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]

    report = {
        "suite": "ingest",
        "timestamp": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "duration_s": round(time.perf_counter() - t0, 1),
        "service": {"base_url": target.base_url, "started_by_bench": target.own,
                    "processes": "contentsvc run (api + projectors)" if target.own else "external"},
        "parameters": {"single_requests": args.single, "single_concurrency": SINGLE_CONCURRENCY,
                       "batches": args.batches, "batch_size": BATCH_SIZE, "batch_concurrency": BATCH_CONCURRENCY,
                       "resolve_rate_per_s": args.rate, "resolve_seconds": 2 * args.seconds,
                       "raw_seconds": args.seconds, "raw_concurrency": RAW_CONCURRENCY, "raw_batch": RAW_BATCH,
                       "text_bytes": TEXT_BYTES, "texts_from": str(args.corpus),
                       "engine_vectors": engine_vectors_enabled(),  # new Corpora embedded by the vectors projector
                       "http": "httpx.AsyncClient, HTTP/1.1 keep-alive, client on the same machine"},
        "machine": machine,
        "targets": judge(results),
        "results": results,
    }
    if own is not None:
        report["server_log"] = scan_server_log(SERVER_LOG)
    report["problems"] = problems(report)
    RESULT_PATH.write_text(json.dumps(report, indent=2) + "\n")
    print(summary_text(report))
    return 0
