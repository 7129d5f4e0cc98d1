"""`contentsvc bench SUITE` refuses counts and durations that leave nothing to measure as a usage
error (exit 2, the rule named), before it starts a service or writes a result: `--runs 0` was a
traceback from max() of no runs."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("suite, argv, named", [
    ("upload", ["--runs", "0"], "--runs are at least 1"),
    ("upload", ["--size-mib", "-1"], "--size-mib"),
    ("ingest", ["--single", "0"], "--single"),
    ("ingest", ["--batches", "0"], "--batches"),
    ("ingest", ["--rate", "0"], "--rate positive"),
    ("embeddings", ["--texts", "0"], "--texts"),
    ("quality", ["--cap", "0"], "--cap is positive"),
    ("search", ["--fresh-rate", "-1"], "--fresh-rate"),
    ("plugins", ["--calls", "0"], "--calls"),
    ("outbound", ["--runs", "0"], "every count"),
])
def test_a_count_or_duration_that_measures_nothing_is_a_usage_error(suite, argv, named, capsys):
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(f"contentsvc.bench.{suite}").main(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
