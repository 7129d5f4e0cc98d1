"""Benchmarks: `contentsvc bench SUITE` runs bench/SUITE.py and writes bench/results/SUITE.json.

driver.py (the run, targets, results file), service.py (the service under test) and
stats.py (latencies, errors) serve every suite; the ingest suite keeps one module per
scenario (ingest_single, ingest_batch, ingest_resolve, journal_raw)."""

from __future__ import annotations

import importlib


def main(suite: str, argv: list[str]) -> int:
    module = importlib.import_module(f"contentsvc.bench.{suite}")
    return module.main(argv)
