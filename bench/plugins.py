"""`contentsvc bench plugins`: what the plugin protocol costs a normalizer.

Usage:
    contentsvc bench plugins [--calls 300] [--warm-up 20] [--versions 100] [--workdir DIR]

Measurements (one run), one module each:
  1. the normalizer round trip (plugins_roundtrip.py): the first-party pdf plugin as a
     real process (`contentsvc plugin serve pdf` on 127.0.0.1), called --calls times
     (after --warm-up calls) through the engine's PluginClient with a tiny one-page PDF
     by file:// reference, against the same extraction in-process (the plugin's own
     `normalize`, which reads each PDF in a bounded child process), each call timed;
     p50 and p99 of both, their difference (the protocol's overhead) and their ratio;
     GET /v0/health on the same connection, the HTTP floor of any call; and the parse
     alone in the bench's own thread, which shows what the bounded child costs.
  2. Versions normalized per second through the plugin path (plugins_throughput.py):
     `contentsvc run` with a contentsvc.toml that pins and launches the pdf plugin (a
     fresh database as `contentsvc bench ingest` starts one, its output in
     bench/results/plugins-server.log), --versions tiny PDFs uploaded and verified
     first, then ingested as Blob Records (POST /v0/records/batch): Versions over the time from the first ingest
     accepted to the last Receipt resolved; and the same for text/plain Blobs carrying
     the same text (the built-in text path), as the reference.

Target: the round trip's p50 overhead at most 2 ms per call on loopback. The figures go to
bench/results/plugins.json with the target's pass or miss; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from contentsvc.bench.driver import (target_lines, RESULTS_DIR, BenchError, Run, closing_lines, fmt, judge, machine_line,
                                     teller, write_results)
from contentsvc.bench.plugins_roundtrip import bench_roundtrip
from contentsvc.bench.plugins_throughput import CONCURRENCY, WARM_UP, bench_throughput, pin_pdf
from contentsvc.bench.service import OwnService, scan_server_log

RESULT_PATH = RESULTS_DIR / "plugins.json"
SERVER_LOG = RESULTS_DIR / "plugins-server.log"
PLUGIN_LOG = RESULTS_DIR / "plugins-plugin.log"
CLIENT_LOG = RESULTS_DIR / "plugins-client.log"

TARGETS = {"overhead_p50_ms": {"op": "<=", "value": 2.0, "unit": "ms"}}


say = teller("plugins")


def run_bench(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    say(f"round trip: {args.warm_up} + {args.calls} calls in-process, then through the plugin ...")
    for log in (PLUGIN_LOG, CLIENT_LOG):
        log.unlink(missing_ok=True)
    roundtrip = bench_roundtrip(workdir, PLUGIN_LOG, CLIENT_LOG, args.calls, args.warm_up)
    say(f"round trip: overhead p50 {roundtrip['overhead_p50_ms']} ms, p99 {roundtrip['overhead_p99_ms']} ms")

    config, port = pin_pdf(workdir / "deploy")
    own = OwnService(SERVER_LOG)
    try:
        target = own.start(home=workdir / "home", extra_env={"CONTENTSVC_CONFIG": str(config)})
        say(f"throughput: uploading {WARM_UP + args.versions} PDFs and as many text Blobs, then ingesting ...")
        throughput = asyncio.run(bench_throughput(target, port, args.versions))
    finally:
        own.stop()
    say(f"throughput: pdf {throughput['pdf_plugin']['versions_per_s']} Versions/s, text "
        f"{throughput['text_reference']['versions_per_s']} Versions/s")
    return {"roundtrip": roundtrip, "throughput": throughput}


def summary_text(report: dict[str, Any]) -> str:
    rt, tp = report["results"]["roundtrip"], report["results"]["throughput"]
    lines = ["", f"contentsvc bench plugins  {report['timestamp']}  {machine_line(report['machine'])}", "-" * 96,
             f"normalizer round trip, {rt['pdf_bytes']} B one-page PDF, {rt['calls']} calls each:",
             f"  {'':<22}{'p50 ms':>10}{'p99 ms':>10}"]
    for name, key in (("through the plugin", "plugin"), ("in-process (pypdf)", "in_process")):
        lines.append(f"  {name:<22}{rt[key]['p50_ms']:>10.2f}{rt[key]['p99_ms']:>10.2f}")
    lines.append(f"  {'parse alone':<22}{rt['unbounded_parse']['p50_ms']:>10.2f}{rt['unbounded_parse']['p99_ms']:>10.2f}"
                 f"   (no child process: the bounded child costs {rt['bounded_child_p50_ms']:.2f} ms at p50)")
    lines.append(f"  {'GET /v0/health':<22}{rt['health_get']['p50_ms']:>10.2f}{rt['health_get']['p99_ms']:>10.2f}"
                 "   (the HTTP floor of any call)")
    lines.append(f"  {'overhead':<22}{rt['overhead_p50_ms']:>10.2f}{rt['overhead_p99_ms']:>10.2f}")
    lines.append(f"  {'ratio':<22}{rt['ratio_p50']:>9.2f}x{rt['ratio_p99']:>9.2f}x")
    lines.append(f"Versions normalized per second, {tp['versions']} each, first ingest accepted to last Receipt "
                 "resolved:")
    for name, key in (("pdf via the plugin", "pdf_plugin"), ("text/plain (built-in)", "text_reference")):
        phase = tp[key]
        lines.append(f"  {name:<22}{fmt(phase['versions_per_s']):>10} /s   ({phase['first_accepted_to_last_resolved_s']}"
                     f" s; ingests accepted in {phase['ingests_accepted_s']} s)")
    lines.append(f"  pdf / text            {tp['pdf_to_text_ratio']:.2f}x")
    lines.append("-" * 96)
    lines += target_lines(report)
    return "\n".join(lines + closing_lines(report, RESULT_PATH))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench plugins", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="timed round trips, each way (default 300)")
    p.add_argument("--warm-up", type=int, default=20, help="untimed calls first, each way (default 20)")
    p.add_argument("--versions", type=int, default=100, help="PDFs, and text Blobs, ingested (default 100)")
    p.add_argument("--workdir", type=Path, help="where the PDFs, the deployment folder and the blob store go "
                   "(default: a temporary directory)")
    args = p.parse_args(argv)
    if args.calls < 1 or args.warm_up < 0 or args.versions < 1:
        p.error("--calls and --versions are at least 1, --warm-up at least 0")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    workdir = Path(tempfile.mkdtemp(prefix="contentsvc-bench-plugins-", dir=args.workdir))
    run = Run()
    try:
        results = run_bench(workdir, args)
    except BenchError as exc:
        print(f"bench plugins failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run.finish()
    report = {
        **run.head("plugins"),
        "parameters": {"calls": args.calls, "warm_up": args.warm_up, "versions": args.versions,
                       "versions_warm_up": WARM_UP, "concurrency": CONCURRENCY,
                       "plugin": "first-party pdf, `contentsvc plugin serve pdf` on 127.0.0.1 (round trip); "
                                 "launched by `contentsvc run` from a contentsvc.toml pin (throughput)",
                       "client": "contentsvc.plugins.client.PluginClient, one per plugin as the materializer "
                                 "keeps it (httpx.AsyncClient, HTTP/1.1 keep-alive, discovery once)",
                       "service": "contentsvc run (api + projectors + the pdf plugin), started by the bench"},
        "machine": run.machine,
        "targets": judge(TARGETS, {"overhead_p50_ms": results["roundtrip"]["overhead_p50_ms"]}),
        "results": results,
        "server_log": scan_server_log(SERVER_LOG),
    }
    write_results(RESULT_PATH, report)
    print(summary_text(report))
    return 0
