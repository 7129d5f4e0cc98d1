"""What the ingest scenarios share: the texts they send, the ingest command, a closed loop
of POSTs, and waiting for (and explaining) Receipts that have not resolved."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import httpx
import msgspec
import psycopg

from contentsvc.bench.driver import BenchError
from contentsvc.bench.http_load import Answer, LoadClient, LoadError
from contentsvc.bench.stats import Errors, cpu_seconds

TEXT_BYTES = 1024
PHASE_CAP_S = 60.0  # no HTTP phase runs longer than this, whatever the counts
DRAIN_CAP_S = 45.0  # how long to wait for the projectors to resolve a phase's Receipts

encode = msgspec.json.encode
decode = msgspec.json.decode


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


def ingest_command(corpus_id: str, record_key: str, text: str) -> dict:
    return {
        "idempotency_key": uuid.uuid4().hex,
        "source": {"corpus_id": corpus_id, "namespace": "bench", "record_key": record_key},
        "content": {"kind": "text", "text": text},
    }


@dataclass
class ClosedLoop:
    sent: int
    wall: float
    cpu: float
    errors: "Errors"
    status: Counter

    def status_counts(self) -> dict[str, int]:
        return {str(k): v for k, v in sorted(self.status.items())}


async def closed_loop(client: LoadClient, path: str, bodies: list[bytes], concurrency: int, ok_status: int,
                      answered: Callable[[float, Answer], None]) -> ClosedLoop:
    """POST the bodies with `concurrency` workers, each sending its next body when the last is
    answered, for at most PHASE_CAP_S; `answered(latency_ms, answer)` for each ok_status answer."""
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
                r = await client.post(path, body)
            except LoadError as exc:
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


async def warm_up(client: LoadClient, path: str, bodies: list[bytes]) -> None:
    """Opens the keep-alive connections before the timed loop; the answers do not count."""
    await asyncio.gather(*(client.post(path, b) for b in bodies), return_exceptions=True)


SEARCHABLE_CHECKED = 16  # Receipts, the last of the sample, whose Versions the searchable wait reads


async def wait_resolved(client: httpx.AsyncClient, receipt_ids: list[str], cap_s: float,
                        database_url: str | None = None) -> dict[str, Any]:
    """Polls the given Receipts (every 50 ms, one at a time) until resolved, and then until their
    Versions are searchable, or cap_s passes: `seconds` to resolved (the materializer's part),
    `searchable_seconds` to searchable (the lexical fold's commit and publication too).

    Receipts still pending at the cap are counted exactly and, when the
    database is known, explained: their journal events, the receipts rows
    and the projectors' checkpoints against the journal head."""
    t0 = time.perf_counter()
    deadline = t0 + cap_s
    errors = Errors()

    async def receipt(rid: str) -> dict:
        try:
            r = await client.get(f"/v0/ingestion-receipts/{rid}")
        except httpx.HTTPError as exc:
            errors.add(type(exc).__name__, str(exc))
            return {}
        if r.status_code != 200:
            errors.add(f"http_{r.status_code}", r.text)
            return {}
        return r.json()

    def resolved(r: dict) -> bool:
        return r.get("state") == "resolved"

    def searchable(r: dict) -> bool:
        return resolved(r) and bool((r.get("availability") or {}).get("searchable"))

    async def wait(left: list[str], done) -> tuple[list[str], float]:
        while left and time.perf_counter() < deadline:
            if done(await receipt(left[0])):
                left.pop(0)
            else:
                await asyncio.sleep(0.05)
        return left, time.perf_counter() - t0

    left, waited = await wait(list(receipt_ids), resolved)
    searchable_after = None
    if left:  # at the cap: which of the remaining ones are really still pending?
        left = [rid for rid in left if not resolved(await receipt(rid))]
    else:  # the lexical fold publishes in journal order: the last accepted are searchable last
        unsearchable, after = await wait(list(receipt_ids[-SEARCHABLE_CHECKED:]), searchable)
        searchable_after = None if unsearchable else round(after, 3)
    out = {"checked": len(receipt_ids), "unresolved": len(left), "seconds": round(waited, 3),
           "searchable_seconds": searchable_after, "poll_errors": errors.report()}
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
