"""`contentsvc bench ingest`: ingest throughput, latency, and the journal's raw append rate.

Usage:
    contentsvc bench ingest [--url URL --api-key KEY] [--database-url URL] [--seconds N]
                            [--single N] [--single-runs N] [--batches N] [--rate R]

Against a running service when --url and --api-key (or CONTENTSVC_URL and
CONTENTSVC_API_KEY) are given; the raw journal figures then need
--database-url (that service's database) and are skipped without it.
Otherwise the bench starts its own service: a fresh database on the server
of CONTENTSVC_DATABASE_URL (else CONTENTSVC_TEST_DATABASE_URL, else an
embedded PostgreSQL in a temporary directory), `python -m contentsvc.cli run`
on a free port with its output in bench/results/ingest-server.log, and an
all-actions key; it stops the service and drops the database at the end.

Measurements (one run, one database), one module each:
  1. single ingest (ingest_single.py): POST /v0/records, concurrency 16,
     --single requests; then how long until the last Receipts are resolved,
     and their Versions searchable (also after phase 2). --single-runs times
     back to back: the throughput and p99 judged are the medians of the runs.
  2. batch ingest (ingest_batch.py): POST /v0/records/batch, 100 entries each,
     concurrency 4, --batches batches.
  3. 202-to-resolved (ingest_resolve.py): --rate ingests per second for
     2 x --seconds, each Receipt's `receipt.resolved` event followed on the
     change stream (/v0/changes/stream).
  3b. (a service the bench started) the batches of phase 2 again with its
     projectors and workers stopped (SIGSTOP) while they are sent: the API and
     PostgreSQL alone on the cores, the reference for phase 2.
  Each of these phases gives, in its `cpu_s`, the CPU seconds of every process of the service,
  of the bench and of PostgreSQL (when it runs on this machine) while its load was sent
  (process_cpu.py): where the cores went.
  4. raw journal append (journal_raw.py; contentsvc.journal.store.append, 1 event per transaction,
     1 and 4 connections, and 100 events per call) against the ceiling of a plain
     durable INSERT of an equivalent row into a table shaped like the journal;
     --seconds each. Its events are kind "bench.raw" of org "bench-raw": not
     public, so no feed shows them, and the projectors skip the kind.
     The same run measures the ceilings of phases 1 and 2: plain durable INSERTs,
     one row per transaction on 16 connections and 100 rows per transaction on 4;
     each phase's rate over its ceiling is in `ratios_to_ceilings`.

Only 202 answers (and 202 batch items) count as successes; every other answer,
timeout or transport error is counted and reported. The figures are written to
bench/results/ingest.json with the targets and whether each was met (a run
against a running service to bench/results/ingest-external.json instead, so
it never replaces the reference run); nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any, Awaitable

import httpx
import psycopg

from contentsvc.bench.driver import (
    DATASETS,
    RESULTS_DIR,
    BenchError,
    Run,
    teller,
    write_results,
)
from contentsvc.bench.ingest_batch import BATCH_CONCURRENCY, BATCH_SIZE, bench_batch
from contentsvc.bench.ingest_report import judge_targets, problems, summary_text
from contentsvc.bench.ingest_requests import TEXT_BYTES, Texts, explain_pending
from contentsvc.bench.ingest_resolve import bench_resolve
from contentsvc.bench.ingest_single import SINGLE_CONCURRENCY, bench_single, bench_single_runs
from contentsvc.bench.journal_raw import RAW_BATCH, RAW_CONCURRENCY, bench_raw, ratios_to_ceilings
from contentsvc.bench.process_cpu import CpuAccount, counted
from contentsvc.bench.service import (
    OwnService,
    Target,
    api_client,
    create_corpus,
    scan_server_log,
)

from contentsvc.config import current_settings
from contentsvc.search.engine_space import engine_vectors_enabled

say = teller("ingest")

RESULT_PATH = RESULTS_DIR / "ingest.json"
# A run against a running service (--url) is measured on a service the bench did not start, with
# no reference phases: it is written beside the reference run, never over it.
EXTERNAL_RESULT_PATH = RESULTS_DIR / "ingest-external.json"
SERVER_LOG = RESULTS_DIR / "ingest-server.log"
DEFAULT_CORPUS = DATASETS / "scifact" / "corpus.jsonl"


async def announced(name: str, phase: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    """Awaits one phase, saying on stderr when it starts and how long it took."""
    say(f"{name} ...")
    t = time.perf_counter()
    figures = await phase
    say(f"{name} done in {time.perf_counter() - t:.1f} s")
    return figures


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


async def run_bench(target: Target, texts: Texts, args, cpu: CpuAccount | None) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    async with api_client(target, 2) as client:
        r = await client.get("/v0/health")
        if r.status_code != 200:
            raise BenchError(f"health: {r.status_code} {r.text[:300]}")
        ingest_corpus = await create_corpus(client, f"bench-{run_id}")
        latency_corpus = await create_corpus(client, f"bench-{run_id}-lat")

    async def resolve() -> dict[str, Any]:
        with counted(cpu) as cpu_s:  # the whole phase is its load
            figures = await bench_resolve(target, texts, latency_corpus, run_id, args.rate, 2 * args.seconds)
        return {**figures, **({"cpu_s": cpu_s} if cpu_s else {})}

    phases = [
        ("single", lambda: bench_single_runs(target, texts, ingest_corpus, run_id, args.single, args.single_runs,
                                             cpu=cpu)),
        ("batch", lambda: bench_batch(target, texts, ingest_corpus, run_id, args.batches, cpu=cpu)),
        ("resolve", resolve),
    ]
    if target.supervisor_pid:  # the references: the same load with the cores to the API alone
        phases += [
            ("single_folds_paused", lambda: bench_single(target, texts, ingest_corpus, f"{run_id}p", args.single,
                                                         pause_folds=True, cpu=cpu)),
            ("batch_folds_paused", lambda: bench_batch(target, texts, ingest_corpus, f"{run_id}p", args.batches,
                                                       pause_folds=True, cpu=cpu)),
        ]
    for name, phase in phases:
        results[name] = await announced(name, phase())

    if target.database_url:
        results["integrity"] = await check_all_resolved(target.database_url, [ingest_corpus, latency_corpus])
        results["raw_journal"] = await announced("raw journal append", bench_raw(target.database_url, texts,
                                                                                args.seconds))
        results["ratios_to_ceilings"] = ratios_to_ceilings(results["single"], results["batch"],
                                                           results["raw_journal"], results.get("single_folds_paused"),
                                                           results.get("batch_folds_paused"))
    else:
        results["integrity"] = {"skipped": "no database URL"}
        results["raw_journal"] = {"skipped": "no database URL (give --database-url with --url)"}
    results["corpora"] = {"ingest": ingest_corpus, "latency": latency_corpus}
    return results


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench ingest", description=__doc__.split("\n\n")[0])
    client = current_settings().client
    p.add_argument("--url", default=client.url, help="a running service (else one is started)")
    p.add_argument("--api-key", default=client.api_key,
                   help="an all-actions key of that service")
    p.add_argument("--database-url", help="the service's database, for the raw journal figures")
    p.add_argument("--seconds", type=float, default=5.0,
                   help="length of each raw append loop; the 202-to-resolved phase runs twice this (default 5)")
    # Phases of several seconds each: long enough that the folds of what was accepted compete
    # for the cores, as under sustained load, rather than a burst that ends before they start.
    p.add_argument("--single", type=int, default=10000, help="single ingest requests (default 10000)")
    p.add_argument("--single-runs", type=int, default=3,
                   help="single phases run back to back; their medians are judged (default 3)")
    p.add_argument("--batches", type=int, default=400, help="batches of 100 entries (default 400)")
    p.add_argument("--rate", type=float, default=50.0, help="ingests/s of the 202-to-resolved phase (default 50)")
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="JSONL with _id, title, text")
    args = p.parse_args(argv)
    if min(args.single, args.single_runs, args.batches) < 1 or min(args.seconds, args.rate) <= 0:
        p.error("--single, --single-runs and --batches are at least 1; --seconds and --rate positive")
    if bool(args.url) != bool(args.api_key):
        p.error("--url and --api-key go together (or CONTENTSVC_URL and CONTENTSVC_API_KEY)")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    try:
        texts = Texts(args.corpus)
    except (OSError, ValueError, BenchError) as exc:
        print(f"bench ingest: cannot read texts from {args.corpus}: {exc}", file=sys.stderr)
        return 1
    run = Run()
    own: OwnService | None = None
    try:
        if args.url:
            base = args.url.rstrip("/")
            base = base[: -len("/v0")] if base.endswith("/v0") else base
            target = Target(base, args.api_key, args.database_url, own=False)
        else:
            own = OwnService(SERVER_LOG)
            target = own.start()
        with closing(CpuAccount(target.supervisor_pid, target.database_url)) as cpu:
            results = asyncio.run(run_bench(target, texts, args, cpu))
    except BenchError as exc:
        print(f"bench ingest failed: {exc}", file=sys.stderr)
        return 1
    except (httpx.TransportError, psycopg.OperationalError) as exc:
        # An unreachable --url or --database-url, or a service that went away: one line, no traceback
        # (PostgreSQL's message names its server; httpx's does not name the URL).
        at = f" ({exc.request.method} {exc.request.url})" if isinstance(exc, httpx.TransportError) else ""
        print(f"bench ingest failed: {type(exc).__name__}{at}: {exc}", file=sys.stderr)
        return 1
    finally:
        if own is not None:
            own.stop()
    run.finish()

    report = {
        **run.head("ingest"),
        "service": {"base_url": target.base_url, "started_by_bench": target.own,
                    "processes": "contentsvc run (api + projectors)" if target.own else "external"},
        "parameters": {"single_requests": args.single, "single_runs": args.single_runs,
                       "single_concurrency": SINGLE_CONCURRENCY,
                       "batches": args.batches, "batch_size": BATCH_SIZE, "batch_concurrency": BATCH_CONCURRENCY,
                       "resolve_rate_per_s": args.rate, "resolve_seconds": 2 * args.seconds,
                       "raw_seconds": args.seconds, "raw_concurrency": RAW_CONCURRENCY, "raw_batch": RAW_BATCH,
                       "text_bytes": TEXT_BYTES, "texts_from": str(args.corpus),
                       "engine_vectors": engine_vectors_enabled(),  # new Corpora embedded by the vectors projector
                       "http": "httpx.AsyncClient, HTTP/1.1 keep-alive, client on the same machine"},
        "machine": run.machine,
        "targets": judge_targets(results),
        "results": results,
    }
    if own is not None:
        report["server_log"] = scan_server_log(SERVER_LOG)
    report["problems"] = problems(report)
    path = RESULT_PATH if own is not None else EXTERNAL_RESULT_PATH
    write_results(path, report)
    print(summary_text(report, path))
    return 0
