"""`contentsvc bench` as an operator meets it: one bench at a time (a second refuses at once,
naming the running one, rather than measuring cores the first is using and overwriting its
results: bench/__init__.py), and a bare `contentsvc bench` asks for the suite alone."""

from __future__ import annotations

import fcntl
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
