"""Benchmarks: `contentsvc bench SUITE` runs bench/SUITE.py and writes bench/results/SUITE.json."""

from __future__ import annotations

import importlib


def main(suite: str, argv: list[str]) -> int:
    module = importlib.import_module(f"contentsvc.bench.{suite}")
    return module.main(argv)
