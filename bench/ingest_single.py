"""Scenario 1, single ingest: POST /v0/records with SINGLE_CONCURRENCY workers in a closed
loop, then how long the projectors take to resolve the last Receipts."""

from __future__ import annotations

import statistics
from typing import Any

from contentsvc.bench.ingest_requests import (DRAIN_CAP_S, PHASE_CAP_S, Texts, closed_loop, decode, encode,
                                              ingest_command, wait_resolved, warm_up)
from contentsvc.bench.http_load import Answer, LoadClient
from contentsvc.bench.process_cpu import CpuAccount, counted
from contentsvc.bench.service import Target, api_client, folds_paused
from contentsvc.bench.stats import latency_summary, median_low_index

SINGLE_CONCURRENCY = 16


async def bench_single(target: Target, texts: Texts, corpus_id: str, run_id: str, n: int,
                       pause_folds: bool = False, cpu: CpuAccount | None = None) -> dict[str, Any]:
    """pause_folds: the reference run, the service's projectors and workers stopped while the
    requests are sent (service.folds_paused); they resume before the drain."""
    load = LoadClient(target.base_url, target.api_key, SINGLE_CONCURRENCY)
    async with api_client(target, SINGLE_CONCURRENCY) as client:
        await warm_up(load, "/v0/records", [encode(ingest_command(corpus_id, f"{run_id}-w{i}", texts.take()))
                                            for i in range(SINGLE_CONCURRENCY * 2)])

        bodies = [encode(ingest_command(corpus_id, f"{run_id}-s{i}", texts.take())) for i in range(n)]
        latencies: list[float] = []
        receipts: list[str] = []

        def accepted(elapsed: float, r: Answer) -> None:
            latencies.append(elapsed)
            receipts.append(decode(r.content)["receipt_id"])

        with counted(cpu) as cpu_s, folds_paused(target, pause_folds) as paused:
            loop = await closed_loop(load, "/v0/records", bodies, SINGLE_CONCURRENCY, 202, accepted)
        await load.aclose()
        drain = await wait_resolved(client, receipts[-SINGLE_CONCURRENCY * 2:], DRAIN_CAP_S, target.database_url)

    return {
        **({"folds_paused": paused} if pause_folds else {}),
        **({"cpu_s": cpu_s} if cpu_s else {}),
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


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What `bench_single_runs` judges: the run of median throughput (the lower middle one for an
    even count) and the median p99 over every run, each median taken on its own."""
    middle = median_low_index([r["throughput_req_per_s"] or 0 for r in runs])
    p99s = [r["p99_ms"] for r in runs if r["p99_ms"] is not None]
    return {"median_run": middle, "median_throughput_req_per_s": runs[middle]["throughput_req_per_s"],
            "median_p99_ms": statistics.median_low(p99s) if p99s else None}


async def bench_single_runs(target: Target, texts: Texts, corpus_id: str, run_id: str, n: int, runs: int,
                            cpu: CpuAccount | None = None) -> dict[str, Any]:
    """`runs` single phases back to back, each of `n` new Records: the figures of the run of median
    throughput, with every run's throughput and p99 and the median of each beside them, so that
    one run the machine disturbed (another process on the two cores) decides no target alone."""
    figures = [await bench_single(target, texts, corpus_id, f"{run_id}r{i}", n, cpu=cpu) for i in range(runs)]
    each = [{"throughput_req_per_s": f["throughput_req_per_s"], "p99_ms": f["latency"]["p99_ms"]} for f in figures]
    judged = medians(each)
    return {**figures[judged["median_run"]], **judged, "runs": each}
