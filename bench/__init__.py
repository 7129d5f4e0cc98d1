"""Benchmarks: `contentsvc bench SUITE` runs bench/SUITE.py and writes bench/results/SUITE.json.

driver.py (the run, targets, results file), service.py (the service under test) and
stats.py (latencies, errors) serve every suite; the ingest suite keeps one module per
scenario (ingest_single, ingest_batch, ingest_resolve, journal_raw)."""

from __future__ import annotations

import importlib
import signal


def main(suite: str, argv: list[str]) -> int:
    # A bench stopped by SIGTERM (`timeout`, a CI job's end) unwinds like one interrupted with
    # Ctrl-C: each suite's `finally` stops the service and the embedded database it started,
    # which would otherwise outlive it.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    module = importlib.import_module(f"contentsvc.bench.{suite}")
    return module.main(argv)


def _exit_on_signal(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
