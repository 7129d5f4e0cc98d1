"""Benchmarks: `contentsvc bench SUITE` runs bench/SUITE.py and writes bench/results/SUITE.json;
`contentsvc bench all` (`make bench`) runs every suite in SUITES' order, then lists every target.

driver.py (the run, targets, results file), service.py (the service under test) and
stats.py (latencies, errors) serve every suite; the ingest suite keeps one module per
scenario (ingest_single, ingest_batch, ingest_resolve, journal_raw)."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

# Held by the running bench (its pid and suite inside). Benches measure the machine's cores and
# write bench/results, so one runs at a time; the tests say so in their header while one runs.
LOCK_PATH = Path(__file__).resolve().parent / "results" / ".running"

SUITES = ("ingest", "search", "quality", "upload", "plugins", "monitoring", "connectors", "embeddings", "outbound")


def main(suite: str, argv: list[str]) -> int:
    # A bench stopped by SIGTERM (`timeout`, a CI job's end) unwinds like one interrupted with
    # Ctrl-C: each suite's `finally` stops the service and the embedded database it started,
    # which would otherwise outlive it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with open(LOCK_PATH, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"error: another bench is running ({running_bench()}); benches share the cores"
                  " and bench/results, so one runs at a time", file=sys.stderr)
            return 1
        if suite != "all":
            return _run(lock, suite, argv)
        if argv:
            print("error: `contentsvc bench all` takes no options; give them to one suite", file=sys.stderr)
            return 2
        started = time.time()
        failed = [name for name in SUITES if _run(lock, name, []) != 0]
        _print_targets(started)
        if failed:
            print(f"error: the {', '.join(failed)} bench(es) ended in error", file=sys.stderr)
        return 1 if failed else 0


def _run(lock, suite: str, argv: list[str]) -> int:
    lock.seek(0)
    lock.truncate(0)
    lock.write(f"pid {os.getpid()}, bench {suite}")
    lock.flush()
    return importlib.import_module(f"contentsvc.bench.{suite}").main(argv)


def _print_targets(started: float, results_dir: Path | None = None) -> None:
    """Every suite's targets from the results file this run wrote, so its outcome reads in one place."""
    from contentsvc.bench.driver import RESULTS_DIR, target_lines

    print("\ncontentsvc bench all: targets")
    for name in SUITES:
        path = (results_dir or RESULTS_DIR) / f"{name}.json"
        if not path.exists() or path.stat().st_mtime < started:
            lines = ["no results written by this run"]
        else:
            report = json.loads(path.read_text())
            lines = target_lines(report) if report.get("targets") else ["no targets"]
        for line in lines:
            print(f"{name:<11} {line}")


def running_bench() -> str | None:
    """Which bench holds the lock ("pid N, bench S"), or None when none runs."""
    with open(LOCK_PATH, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            return f.read().strip() or "pid unknown"
        fcntl.flock(f, fcntl.LOCK_UN)
        return None


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
