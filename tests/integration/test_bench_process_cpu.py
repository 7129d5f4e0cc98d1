"""`bench ingest` says where the cores went in each phase (bench/process_cpu.py): the CPU seconds
of each process of the service by its role, and of each PostgreSQL backend by the application
that opened it, measured on real processes and a real server."""

import subprocess
import sys
import time

import psutil
import psycopg
import pytest

from contentsvc.bench.process_cpu import CpuAccount, counted, service_role

# A child that spends this much CPU of its own (not wall time: the figure holds on a busy machine).
SPIN = "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(30)"


def test_a_process_outside_the_service_is_labelled_by_its_program():
    # The service's own processes by their role (processes/children.role_of, its own test).
    assert service_role(["/usr/bin/python3", "-m", "contentsvc.cli", "worker", "run", "gc"]) == "worker:gc"
    assert service_role(["/usr/lib/postgresql/15/bin/postgres", "-D", "/data"]) == "postgres"
    assert service_role(["/usr/bin/python3", "/usr/local/bin/contentsvc", "projector", "replay", "lexical"]) \
        == "python3"


def test_a_phase_counts_a_childs_cpu_and_a_backends_by_its_application(database_url):
    # The supervisor's place: this test's process; its child spins.
    account = CpuAccount(psutil.Process().pid, database_url)
    if not account.postgres_is_local:  # the tests' server, embedded or not, runs here
        pytest.skip("the backends' CPU is counted only for a server on this machine")
    with psycopg.connect(database_url, autocommit=True, application_name="contentsvc probe") as probe:
        probe.execute("SELECT 1")
        with counted(account) as figures:
            child = subprocess.Popen([sys.executable, "-c", SPIN, "contentsvc.cli", "worker", "run", "probe"])
            try:
                deadline = time.monotonic() + 30
                while sum(psutil.Process(child.pid).cpu_times()[:2]) < 0.29 and time.monotonic() < deadline:
                    time.sleep(0.01)
                probe.execute("SELECT count(*) FROM generate_series(1, 3000000)")
            finally:
                spun = psutil.Process(child.pid).cpu_times()
        child.kill()
        child.wait()
    account.close()
    by_process = figures["by_process"]
    assert figures["postgres_counted"] is True
    # The child, by the role its command line names; all it spent, since it started in the block.
    assert by_process["worker:probe"] == pytest.approx(spun.user + spun.system, abs=0.02)
    # The backend that counted, by its application's name.
    assert by_process["postgres: probe"] > 0.05
    assert figures["total"] >= by_process["worker:probe"] + by_process["postgres: probe"]
