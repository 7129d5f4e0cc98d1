"""Scenario 2, batch ingest: POST /v0/records/batch of BATCH_SIZE entries with
BATCH_CONCURRENCY workers in a closed loop; records accepted per second, and accepted and
resolved end to end."""

from __future__ import annotations

import json
from typing import Any

from contentsvc.bench.ingest_requests import (DRAIN_CAP_S, PHASE_CAP_S, Texts, closed_loop, decode, encode,
                                              ingest_command, wait_resolved, warm_up)
from contentsvc.bench.http_load import Answer, LoadClient
from contentsvc.bench.process_cpu import CpuAccount, counted
from contentsvc.bench.service import Target, api_client, folds_paused
from contentsvc.bench.stats import Errors, latency_summary

BATCH_SIZE = 100
BATCH_CONCURRENCY = 4


async def bench_batch(target: Target, texts: Texts, corpus_id: str, run_id: str, batches: int,
                      pause_folds: bool = False, cpu: CpuAccount | None = None) -> dict[str, Any]:
    """pause_folds: the reference run, the service's projectors and workers stopped while the
    batches are sent (service.folds_paused); they resume before the drain."""
    bodies = []
    for b in range(batches):
        entries = [ingest_command(corpus_id, f"{run_id}-b{b}-{i}", texts.take()) for i in range(BATCH_SIZE)]
        bodies.append(encode({"entries": entries}))
    latencies: list[float] = []
    last_receipts: list[str] = []
    item_errors = Errors()
    accepted = 0

    load = LoadClient(target.base_url, target.api_key, BATCH_CONCURRENCY)
    async with api_client(target, BATCH_CONCURRENCY) as client:
        # One small batch per connection.
        await warm_up(load, "/v0/records/batch", [
            encode({"entries": [ingest_command(corpus_id, f"{run_id}-bw{c}-{i}", texts.take()) for i in range(5)]})
            for c in range(BATCH_CONCURRENCY)])

        def answered(elapsed: float, r: Answer) -> None:
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

        with counted(cpu) as cpu_s, folds_paused(target, pause_folds) as paused:
            loop = await closed_loop(load, "/v0/records/batch", bodies, BATCH_CONCURRENCY, 200, answered)
        await load.aclose()
        drain = await wait_resolved(client, last_receipts, DRAIN_CAP_S, target.database_url)

    end_to_end = loop.wall + drain["seconds"]
    return {
        **({"folds_paused": paused} if pause_folds else {}),
        **({"cpu_s": cpu_s} if cpu_s else {}),
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
