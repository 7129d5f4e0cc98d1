"""`contentsvc bench` as an operator meets it: one bench at a time (a second refuses at once,
naming the running one, rather than measuring cores the first is using and overwriting its
results: bench/__init__.py), and a bare `contentsvc bench` asks for the suite alone."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys

import pytest

from contentsvc.bench import LOCK_PATH, running_bench


def test_a_second_bench_refuses_and_names_the_running_one():
    with open(LOCK_PATH, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.skip(f"a real bench is running ({running_bench()})")
        lock.truncate(0)
        lock.write("pid 4242, bench ingest")
        lock.flush()
        assert running_bench() == "pid 4242, bench ingest"
        second = subprocess.run([sys.executable, "-m", "contentsvc.cli", "bench", "upload"],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert "another bench is running (pid 4242, bench ingest)" in second.stderr
        assert "Traceback" not in second.stderr and second.stdout == ""
    assert running_bench() is None


def test_a_bare_bench_asks_for_the_suite_only():
    bare = subprocess.run([sys.executable, "-m", "contentsvc.cli", "bench"], capture_output=True, text=True,
                          timeout=60)
    assert bare.returncode == 2
    last_line = bare.stderr.strip().splitlines()[-1]
    assert last_line == "contentsvc bench: error: the following arguments are required: suite"


def test_bench_all_takes_no_suite_options():
    refused = subprocess.run([sys.executable, "-m", "contentsvc.cli", "bench", "all", "--runs", "1"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert "`contentsvc bench all` takes no options" in refused.stderr and "Traceback" not in refused.stderr


def test_bench_all_lists_the_targets_of_the_results_its_run_wrote(tmp_path, capsys):
    from contentsvc.bench import SUITES, _print_targets
    from contentsvc.bench.driver import judge

    goal = {"put_to_copy_ratio": {"op": ">=", "value": 0.8, "unit": "x copy"}}
    (tmp_path / "upload.json").write_text(json.dumps({"targets": judge(goal, {"put_to_copy_ratio": 0.5})}))
    (tmp_path / "outbound.json").write_text(json.dumps({"targets": {}}))
    _print_targets(started=0, results_dir=tmp_path)
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [line.split()[0] for line in lines] == list(SUITES)
    assert "upload      target put_to_copy_ratio" in lines[SUITES.index("upload")]
    assert lines[SUITES.index("upload")].endswith("measured        0.5  MISS")
    assert lines[SUITES.index("outbound")] == "outbound    no targets"
    assert lines[SUITES.index("ingest")] == "ingest      no results written by this run"
    _print_targets(started=float("inf"), results_dir=tmp_path)  # files older than the run are not its figures
    assert capsys.readouterr().out.splitlines()[2:] == [f"{name:<11} no results written by this run" for name in SUITES]
