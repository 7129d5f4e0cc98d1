"""Benchmarks: `contentsvc bench SUITE` runs bench/SUITE.py and writes bench/results/SUITE.json.

driver.py (the run, targets, results file), service.py (the service under test) and
stats.py (latencies, errors) serve every suite; the ingest suite keeps one module per
scenario (ingest_single, ingest_batch, ingest_resolve, journal_raw)."""

from __future__ import annotations

import fcntl
import importlib
import os
import signal
import sys
from pathlib import Path

# Held by the running bench (its pid and suite inside). Benches measure the machine's cores and
# write bench/results, so one runs at a time; the tests say so in their header while one runs.
LOCK_PATH = Path(__file__).resolve().parent / "results" / ".running"


def main(suite: str, argv: list[str]) -> int:
    # A bench stopped by SIGTERM (`timeout`, a CI job's end) unwinds like one interrupted with
    # Ctrl-C: each suite's `finally` stops the service and the embedded database it started,
    # which would otherwise outlive it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    module = importlib.import_module(f"contentsvc.bench.{suite}")
    with open(LOCK_PATH, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"error: another bench is running ({running_bench()}); benches share the cores"
                  " and bench/results, so one runs at a time", file=sys.stderr)
            return 1
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}, bench {suite}")
        lock.flush()
        return module.main(argv)


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
