"""Scenario 2, Versions normalized per second through the plugin path: `contentsvc run` with a
contentsvc.toml pinning the first-party pdf plugin (`launch = "pdf"`, as the README shows), M
tiny PDFs uploaded and verified beforehand, then ingested as Blob Records in batches of 100 (the
API accepts them in a moment, so the Receipts wait on normalization, not on the API); the rate is M over
the time from the first ingest accepted to the last Receipt resolved (the Receipts' own
accepted_at and resolved_at). The reference, in the same run and service: M text/plain Blobs
carrying the same text, which the built-in text path normalizes."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from contentsvc.bench.driver import BenchError
from contentsvc.bench.service import Target, api_client, create_corpus
from contentsvc.bench.tiny_pdf import report_lines, tiny_pdf
from contentsvc.config import MAX_BATCH_ENTRIES
from contentsvc.processes.local_service import free_port
from contentsvc_plugins.pdf.plugin import FOLDER as PDF_FOLDER

CONCURRENCY = 8  # uploads and batches in flight; the API is not what is measured
WARM_UP = 5  # of each kind, resolved before the clock starts (discovery, plan, first connections)
DRAIN_CAP_S = 120.0  # how long a phase's Receipts may take to resolve before the run gives up
VERIFY_CAP_S = 60.0


def pin_pdf(deploy: Path) -> tuple[Path, int]:
    """A deployment folder whose contentsvc.toml pins and launches the pdf plugin on a free port."""
    port = free_port()
    (deploy / "pdf").mkdir(parents=True, exist_ok=True)
    shutil.copy(PDF_FOLDER / "contentsvc-plugin.json", deploy / "pdf")
    config = deploy / "contentsvc.toml"
    config.write_text(f'[plugins.pdf]\nendpoint = "http://127.0.0.1:{port}"\nversion = "0.1.0"\n'
                      'manifest = "pdf/contentsvc-plugin.json"\nlaunch = "pdf"\n')
    return config, port


async def wait_plugin(port: int, cap_s: float = 30.0) -> None:
    deadline = time.monotonic() + cap_s
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"http://127.0.0.1:{port}/v0/health", timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise BenchError(f"the launched pdf plugin did not answer on port {port} within {cap_s:.0f} s")


def document(n: int, media_type: str) -> bytes:
    lines, title = report_lines(n)
    if media_type == "application/pdf":
        return tiny_pdf(lines, title)
    return "\n".join([title, *lines]).encode()  # the same text the PDF carries


async def verified_blob(client: httpx.AsyncClient, data: bytes, media_type: str) -> str:
    """createUpload, the presigned PUT, confirmUpload, and polling until the Blob is verified."""
    r = await client.post("/v0/uploads", json={"idempotency_key": uuid.uuid4().hex, "media_type": media_type,
                                               "size_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    if r.status_code != 201:
        raise BenchError(f"createUpload: {r.status_code} {r.text[:300]}")
    upload = r.json()
    async with httpx.AsyncClient(timeout=30) as anonymous:  # the presigned PUT carries no API key
        r = await anonymous.put(upload["put_url"], content=data, headers=upload["put_headers"])
    if r.status_code != 200:
        raise BenchError(f"PUT: {r.status_code} {r.text[:300]}")
    r = await client.post(f"/v0/uploads/{upload['upload_id']}/confirm")
    if r.status_code != 202:
        raise BenchError(f"confirmUpload: {r.status_code} {r.text[:300]}")
    deadline = time.monotonic() + VERIFY_CAP_S
    while (state := r.json()["state"]) != "verified":
        if state == "failed" or time.monotonic() > deadline:
            raise BenchError(f"upload {upload['upload_id']} is {state}")
        await asyncio.sleep(0.05)
        r = await client.get(f"/v0/uploads/{upload['upload_id']}")
    return r.json()["blob_id"]


async def bounded(coroutines: list, limit: int = CONCURRENCY) -> list:
    gate = asyncio.Semaphore(limit)

    async def one(coroutine):
        async with gate:
            return await coroutine
    return await asyncio.gather(*(one(c) for c in coroutines))


def blob_record(corpus_id: str, key: str, blob_id: str, media_type: str) -> dict[str, Any]:
    return {"idempotency_key": uuid.uuid4().hex,
            "source": {"corpus_id": corpus_id, "namespace": "uploads", "record_key": key},
            "content": {"kind": "blob", "blob_id": blob_id, "media_type": media_type}}


async def ingest_batch(client: httpx.AsyncClient, entries: list[dict[str, Any]]) -> None:
    r = await client.post("/v0/records/batch", json={"entries": entries})
    if r.status_code != 200:
        raise BenchError(f"batch ingest: {r.status_code} {r.text[:300]}")
    refused = [item for item in r.json()["items"] if item.get("status") != 202]
    if refused:
        raise BenchError(f"{len(refused)} batch entries refused, e.g. {refused[0]}")


async def ingest_all(client: httpx.AsyncClient, corpus_id: str, blobs: list[str], media_type: str,
                     prefix: str = "doc") -> None:
    """Batches of MAX_BATCH_ENTRIES: the API accepts them fast, so the Receipts wait on normalization."""
    entries = [blob_record(corpus_id, f"{prefix}-{n}", blob_id, media_type) for n, blob_id in enumerate(blobs)]
    await bounded([ingest_batch(client, entries[i:i + MAX_BATCH_ENTRIES])
                   for i in range(0, len(entries), MAX_BATCH_ENTRIES)])


async def resolved(database_url: str, corpus_id: str, count: int) -> dict[str, Any]:
    """Waits for the corpus's `count` Receipts to resolve; their outcomes and the accepted-to-resolved span."""
    deadline = time.monotonic() + DRAIN_CAP_S
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        while True:
            done, = await (await conn.execute("SELECT count(*) FROM receipts WHERE corpus_id = %s"
                                              " AND state = 'resolved'", (corpus_id,))).fetchone()
            if done >= count:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{count - done} of {count} Receipts of {corpus_id} not resolved after "
                                 f"{DRAIN_CAP_S:.0f} s")
            await asyncio.sleep(0.02)
        span, clean = await (await conn.execute(
            "SELECT extract(epoch FROM max(resolved_at) - min(accepted_at)),"
            " count(*) FILTER (WHERE outcome = 'created' AND diagnostics = '[]'::jsonb)"
            " FROM receipts WHERE corpus_id = %s", (corpus_id,))).fetchone()
    return {"span_s": float(span), "created_without_diagnostics": clean}


async def phase(client: httpx.AsyncClient, target: Target, corpus_id: str, blobs: list[str],
                media_type: str) -> dict[str, Any]:
    started = time.perf_counter()
    await ingest_all(client, corpus_id, blobs, media_type)
    accepted_s = time.perf_counter() - started
    outcome = await resolved(target.database_url, corpus_id, len(blobs))
    wall_s = time.perf_counter() - started
    if outcome["created_without_diagnostics"] != len(blobs):
        raise BenchError(f"{len(blobs) - outcome['created_without_diagnostics']} {media_type} Receipts of "
                         f"{corpus_id} did not resolve created without diagnostics")
    return {
        "media_type": media_type,
        "versions": len(blobs),
        "ingests_accepted_s": round(accepted_s, 3),
        "first_accepted_to_last_resolved_s": round(outcome["span_s"], 3),
        "versions_per_s": round(len(blobs) / outcome["span_s"], 1),
        "client_wall_s": round(wall_s, 3),  # includes up to one 20 ms poll of the Receipts
    }


async def bench_throughput(target: Target, plugin_port: int, versions: int) -> dict[str, Any]:
    await wait_plugin(plugin_port)
    run_id = uuid.uuid4().hex[:8]
    kinds = ("text/plain", "application/pdf")
    async with api_client(target, CONCURRENCY) as client:
        corpora = {name: await create_corpus(client, f"plugins-{run_id}-{name}") for name in ("warm", "text", "pdf")}
        blobs = {}
        for media_type in kinds:
            blobs[media_type] = await bounded([verified_blob(client, document(n, media_type), media_type)
                                               for n in range(WARM_UP + versions)])
        # The warm-up resolves first: the materializer has read the plan and verified the plugin's discovery.
        for media_type in kinds:
            await ingest_all(client, corpora["warm"], blobs[media_type][:WARM_UP], media_type, f"warm-{media_type}")
        await resolved(target.database_url, corpora["warm"], WARM_UP * len(kinds))
        text = await phase(client, target, corpora["text"], blobs["text/plain"][WARM_UP:], "text/plain")
        pdf = await phase(client, target, corpora["pdf"], blobs["application/pdf"][WARM_UP:], "application/pdf")
    return {
        "versions": versions,
        "pdf_bytes": len(document(0, "application/pdf")),
        "text_bytes": len(document(0, "text/plain")),
        "text_reference": text,
        "pdf_plugin": pdf,
        "pdf_to_text_ratio": round(pdf["versions_per_s"] / text["versions_per_s"], 3),
    }
