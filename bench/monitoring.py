"""`contentsvc bench monitoring`: evaluation, notification latency and delivery throughput of
Subscriptions over SciFact.

Usage:
    contentsvc bench monitoring [--subscriptions 1000] [--distinct 250] [--versions 60]
                                [--rate 5] [--seconds 30] [--cap 120] [--dataset DIR]

`contentsvc run` on a fresh database (as `contentsvc bench plugins` starts it, its output in
bench/results/monitoring-server.log) with a contentsvc.toml that launches the first-party `query`
evaluator and names one destination: a receiver the bench serves on 127.0.0.1
(monitoring_receiver.py). The engine's vector space is off (CONTENTSVC_ENGINE_VECTORS=0): the
`query` evaluator does not need enrichment, and embedding would take the cores being measured.
Saved Queries and --subscriptions Subscriptions over --distinct expressions drawn from SciFact's
vocabulary (monitoring_workload.py), then, after a warm-up, the three measurements of
monitoring_phases.py: (1) evaluation throughput over --versions documents ingested at once,
(2) 202-to-webhook latency at --rate documents per second for --seconds, (3) deliveries per
second when phase 1's Records are withdrawn at once.

Targets (this 2-core machine): 202 to webhook p50 at most 1 s and p99 at most 3 s; at least
20,000 decisions per second with deduplication; at least 500 deliveries per second. The figures
go to bench/results/monitoring.json with each target's pass or miss; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg

from contentsvc.bench import monitoring_phases as phases
from contentsvc.bench.driver import target_lines, DATASETS, RESULTS_DIR, BenchError, Run, closing_lines, fmt, judge, \
    machine_line, teller, write_results
from contentsvc.bench.monitoring_receiver import Receiver
from contentsvc.bench.monitoring_workload import deploy, expressions, load_documents, subscribe_all
from contentsvc.bench.process_cpu import CpuAccount, busiest, counted
from contentsvc.bench.service import OwnService, api_client, create_corpus, scan_server_log
from contentsvc.config import current_settings

RESULT_PATH = RESULTS_DIR / "monitoring.json"
SERVER_LOG = RESULTS_DIR / "monitoring-server.log"
WARM_UP_VERSIONS = 3

TARGETS = {
    "webhook_p50_ms": {"op": "<=", "value": 1000.0, "unit": "ms"},
    "webhook_p99_ms": {"op": "<=", "value": 3000.0, "unit": "ms"},
    "decisions_per_s": {"op": ">=", "value": 20000.0, "unit": "/s"},
    "deliveries_per_s": {"op": ">=", "value": 500.0, "unit": "/s"},
}


say = teller("monitoring")


async def run_bench(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    docs = load_documents(args.dataset / "corpus.jsonl")
    needed = WARM_UP_VERSIONS + args.versions + int(args.rate * args.seconds)
    if needed > len(docs):
        raise BenchError(f"{needed} documents needed, the data set has {len(docs)}")
    warm = docs[:WARM_UP_VERSIONS]
    burst = docs[WARM_UP_VERSIONS:WARM_UP_VERSIONS + args.versions]
    steady = docs[WARM_UP_VERSIONS + args.versions:needed]
    exprs = expressions(docs, args.distinct)

    receiver = Receiver("whsec_" + base64.b64encode(os.urandom(32)).decode())
    await receiver.start()
    config = deploy(workdir / "deploy", receiver.url, receiver.secret)
    own = OwnService(SERVER_LOG)
    cpu = None
    try:
        target = own.start(home=workdir / "home", extra_env={"CONTENTSVC_CONFIG": str(config),
                                                             "CONTENTSVC_ENGINE_VECTORS": "0"})
        run_id = uuid.uuid4().hex[:6]
        async with api_client(target, 16, timeout=60) as client, \
                await psycopg.AsyncConnection.connect(target.database_url, autocommit=True) as conn:
            cpu = CpuAccount(target.supervisor_pid, target.database_url)
            corpora = {name: await create_corpus(client, f"mon-{run_id}-{name}")
                       for name in ("warm", "burst", "steady")}
            say(f"creating {len(exprs)} Saved Queries and {args.subscriptions} Subscriptions ...")
            workload = await subscribe_all(client, list(corpora.values()), exprs, args.subscriptions)
            say(f"warm-up: {len(warm)} Versions ...")
            await phases.warm_up(client, conn, corpora["warm"], warm, args.subscriptions)
            say(f"evaluation throughput: {len(burst)} Versions x {args.subscriptions} Subscriptions ...")
            with counted(cpu) as evaluation_cpu:
                evaluation = await phases.evaluation_throughput(client, conn, receiver, corpora["burst"], burst,
                                                                args.subscriptions, workload["dedup_ratio"],
                                                                args.cap)
            evaluation["cpu_s"] = evaluation_cpu
            say(f"evaluation: {fmt(evaluation['decisions_per_s'])} decisions/s; "
                f"latency: {args.rate}/s for {args.seconds:.0f} s ...")
            latency = await phases.latency(client, conn, receiver, corpora["steady"], steady, args.rate,
                                           args.seconds, args.subscriptions, args.cap)
            say(f"latency: p50 {latency['every_webhook']['p50_ms']} ms; delivery burst ...")
            with counted(cpu) as delivery_cpu:
                delivery = await phases.delivery_throughput(client, conn, receiver, corpora["burst"], burst, args.cap)
            delivery["cpu_s"] = delivery_cpu
            say(f"deliveries: {fmt(delivery['deliveries_per_s'])}/s")
    finally:
        if cpu is not None:
            cpu.close()
        own.stop()
        await receiver.stop()
    return {"workload": workload, "evaluation": evaluation, "latency": latency, "delivery": delivery,
            "receiver": {"received": len(receiver.arrivals), "signatures_verified": receiver.verified,
                         "signature_failures": receiver.verification_failures, "malformed": receiver.malformed}}


def summary_text(report: dict[str, Any]) -> str:
    res = report["results"]
    w, ev, lat, dl = res["workload"], res["evaluation"], res["latency"], res["delivery"]
    lines = ["", f"contentsvc bench monitoring  {report['timestamp']}  {machine_line(report['machine'])}", "-" * 96,
             f"{w['subscriptions']} Subscriptions over {w['distinct_expressions']} distinct `query` expressions "
             f"(dedup x{w['dedup_ratio']}, the most shared by {w['most_shared_expression_subscriptions']})",
             f"evaluation, {ev['versions']} Versions ingested at once: {ev['settled_decisions']:,} of "
             f"{ev['expected_decisions']:,} decisions settled in {ev['first_to_last_settled_s']} s",
             f"  {fmt(ev['decisions_per_s'])} decisions/s ({fmt(ev['decisions_per_s_10_to_90pct'])} between 10 and 90 %),"
             f" {fmt(ev['evaluator_evaluations_per_s'])} evaluator evaluations/s; {ev['matches']} Matches "
             f"({ev['match_share_pct']} %), {ev['subscriptions_with_evaluation_error']} Subscriptions with an evaluation error",
             f"202 -> webhook at {lat['rate_per_s']}/s for {lat['seconds']:.0f} s: {lat['ingested']} Records, "
             f"{lat['matching_records']} matching, {lat['webhooks_received']} webhooks of {lat['matches']} Matches",
             f"  {'':<28}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'max ms':>10}"]
    for name, key in (("every webhook", "every_webhook"), ("first webhook per Record", "first_webhook_per_record"),
                      ("last webhook per Record", "last_webhook_per_record")):
        s = lat[key]
        lines.append(f"  {name:<28}{fmt(s['p50_ms']):>10}{fmt(s['p95_ms']):>10}{fmt(s['p99_ms']):>10}"
                     f"{fmt(s['max_ms']):>10}")
    lines.append(f"delivery burst ({dl['records_withdrawn']} Records withdrawn): {dl['received']} of "
                 f"{dl['expected_deliveries']} match.withdrawn webhooks in {dl['first_to_last_arrival_s']} s, "
                 f"{fmt(dl['deliveries_per_s'])}/s (backlog up to {dl['max_pending_deliveries_seen']})")
    for phase, figures in (("evaluation", ev), ("delivery burst", dl)):
        if figures.get("cpu_s"):
            lines.append(f"cpu s {phase}: {figures['cpu_s']['total']} s  {busiest(figures['cpu_s'])}")
    lines.append("-" * 96)
    lines += target_lines(report)
    return "\n".join(lines + closing_lines(report, RESULT_PATH))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench monitoring", description=__doc__.split("\n\n")[0])
    p.add_argument("--subscriptions", type=int, default=1000, help="Subscriptions (default 1000)")
    p.add_argument("--distinct", type=int, default=250, help="distinct expressions among them (default 250)")
    p.add_argument("--versions", type=int, default=60, help="documents ingested at once for the evaluation "
                   "throughput and the delivery burst (default 60)")
    p.add_argument("--rate", type=float, default=5.0, help="documents per second for the latency (default 5)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the steady ingest runs (default 30)")
    p.add_argument("--cap", type=float, default=120.0, help="the most any phase waits for its work "
                   "(default 120 s)")
    p.add_argument("--dataset", type=Path, default=DATASETS / "scifact", help="SciFact's folder")
    p.add_argument("--workdir", type=Path, help="where the deployment folder and the blob store go "
                   "(default: a temporary directory)")
    args = p.parse_args(argv)
    if not 1 <= args.distinct <= args.subscriptions or args.versions < 1 or args.rate <= 0 or args.seconds <= 0:
        p.error("1 <= --distinct <= --subscriptions; --versions at least 1; --rate and --seconds positive")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    workdir = Path(tempfile.mkdtemp(prefix="contentsvc-bench-monitoring-", dir=args.workdir))
    run = Run()
    try:
        results = asyncio.run(run_bench(workdir, args))
    except BenchError as exc:
        print(f"bench monitoring failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run.finish()
    settings = current_settings()
    report = {
        **run.head("monitoring"),
        "parameters": {"subscriptions": args.subscriptions, "distinct_expressions": args.distinct,
                       "versions": args.versions, "rate_per_s": args.rate, "seconds": args.seconds,
                       "warm_up_versions": WARM_UP_VERSIONS, "dataset": str(args.dataset),
                       "evaluation_concurrency": settings.monitoring.evaluation_concurrency,
                       "delivery_concurrency": settings.deliveries.concurrency,
                       "evaluator": "first-party `query` 0.1.0, launched by `contentsvc run` from a contentsvc.toml "
                                    "pin",
                       "receiver": "asyncio HTTP/1.1 keep-alive on 127.0.0.1 in the bench process, answers 200 at "
                                   "once; every 10th webhook verified (standardwebhooks)",
                       "service": "contentsvc run (api + projectors + monitor + deliveries + the query plugin), "
                                  "CONTENTSVC_ENGINE_VECTORS=0, started by the bench"},
        "machine": run.machine,
        "targets": judge(TARGETS, {
            "webhook_p50_ms": results["latency"]["every_webhook"]["p50_ms"],
            "webhook_p99_ms": results["latency"]["every_webhook"]["p99_ms"],
            "decisions_per_s": results["evaluation"]["decisions_per_s"],
            "deliveries_per_s": results["delivery"]["deliveries_per_s"]}),
        "results": results,
        "server_log": scan_server_log(SERVER_LOG),
    }
    write_results(RESULT_PATH, report)
    print(summary_text(report))
    return 0
