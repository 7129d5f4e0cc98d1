"""The process lifecycle an operator sees: signals stop everything, one `run` per home, a busy
port refused, a crash leaves nothing that blocks the next start, `keys` says which database it
wrote to, and the supervisor brings a dead embedded PostgreSQL back.

Every `run` here uses an embedded PostgreSQL in a temporary home (never the shared server), so
killing its postmaster harms no one else. The homes live in directories of their own under the
system temporary directory: as root, pgserver runs PostgreSQL as another user, who must be able to
reach the data directory (pytest keeps its own temporary root private).
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from psycopg.conninfo import conninfo_to_dict

from contentsvc.processes.listener import EXIT_BUSY
from contentsvc.processes.local_service import free_port
from contentsvc.processes.registry import PROCESSES
from tests.conftest import health_status, json_lines, wait_healthy

STOP_BOUND_S = 10  # SIGTERM/SIGINT: every child and the embedded server gone within 10 s
REFUSAL_BOUND_S = 30  # "at once": the imports of a cold interpreter on a busy machine, nothing more


@pytest.fixture
def scratch():
    """A directory PostgreSQL's own user can reach, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="contentsvc-lifecycle-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _environment(home: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CONTENTSVC_DATABASE_URL", "CONTENTSVC_HOME")}
    if home is not None:
        env["CONTENTSVC_HOME"] = str(home)
    return {**env, **extra}


def _cli(*args: str, home: Path | None, cwd: Path | None = None, timeout: float = 90,
         **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "contentsvc.cli", *args], capture_output=True, text=True,
                          env=_environment(home, **extra), cwd=cwd, timeout=timeout)


def _postmaster_pid(home: Path) -> int:
    return int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids: list[int], deadline: float) -> list[int]:
    """The pids still running at the deadline (empty as soon as all are gone)."""
    while True:
        alive = [pid for pid in pids if not _gone(pid)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.1)


class EmbeddedRun:
    """`contentsvc run` (or `serve`) with no database URL: the embedded PostgreSQL in `home`."""

    def __init__(self, home: Path, log_path: Path, command: str = "run", ready_timeout: float = 120) -> None:
        self.home, self.log_path = home, log_path
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab")
        self.process = subprocess.Popen([sys.executable, "-m", "contentsvc.cli", command, "--port", str(self.port)],
                                        env=_environment(home), stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            wait_healthy(self.base_url, self.process, log_path, ready_timeout)
        except BaseException:
            self.kill()
            raise

    def children(self) -> list[int]:
        return [child.pid for child in psutil.Process(self.process.pid).children()]

    def kill(self) -> None:
        """Cleanup after a failed assertion: the supervisor, its children and its postmaster."""
        pids = []
        if self.process.poll() is None:
            pids = self.children()
        try:
            pids.append(_postmaster_pid(self.home))
        except (OSError, ValueError, IndexError):
            pass
        for pid in [self.process.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)
        self._log.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_child_and_the_embedded_server(scratch, tmp_path, signum):
    # The supervisor alone gets the signal (as from `kill PID`): it stops its children and the
    # embedded PostgreSQL it started, within 10 s, and exits 0.
    run = EmbeddedRun(scratch / "home", tmp_path / "run.log")
    try:
        children, postmaster = run.children(), _postmaster_pid(run.home)
        assert len(children) == len(PROCESSES) and not _gone(postmaster)
        signalled = time.monotonic()
        run.process.send_signal(signum)
        assert run.process.wait(timeout=STOP_BOUND_S) == 0
        assert _wait_gone([*children, postmaster], signalled + STOP_BOUND_S) == []
        assert json.loads((run.home / "pgdata" / ".handle_pids.json").read_text()) == []
    finally:
        run.kill()


def test_serve_alone_stops_its_embedded_server_on_sigterm(scratch, tmp_path):
    # `serve` without a URL owns the embedded server it started: SIGTERM stops it too.
    run = EmbeddedRun(scratch / "home", tmp_path / "serve.log", command="serve")
    try:
        postmaster = _postmaster_pid(run.home)
        signalled = time.monotonic()
        run.process.send_signal(signal.SIGTERM)
        assert run.process.wait(timeout=STOP_BOUND_S) == 0
        assert _wait_gone([postmaster], signalled + STOP_BOUND_S) == []
    finally:
        run.kill()


def test_a_killed_supervisor_leaves_nothing_that_blocks_the_next_run(scratch, tmp_path):
    # A crash (SIGKILL: no cleanup at all) of the supervisor: its children die with it (the
    # parent-death signal), its pid stays behind in pgdata/.handle_pids.json and the lock file,
    # and the next `run` in the same home starts anyway, drops the dead pid, and can stop the
    # server when it ends.
    home = scratch / "home"
    first = EmbeddedRun(home, tmp_path / "first.log")
    children = first.children()
    first.process.kill()
    first.process.wait(timeout=10)
    try:
        assert _wait_gone(children, time.monotonic() + STOP_BOUND_S) == []
        assert first.process.pid in json.loads((home / "pgdata" / ".handle_pids.json").read_text())
        second = EmbeddedRun(home, tmp_path / "second.log")
        try:
            assert json.loads((home / "pgdata" / ".handle_pids.json").read_text()) == [second.process.pid]
            assert (home / "contentsvc.pid").read_text().strip() == str(second.process.pid)
            postmaster = _postmaster_pid(home)
            signalled = time.monotonic()
            second.process.send_signal(signal.SIGTERM)
            assert second.process.wait(timeout=STOP_BOUND_S) == 0
            assert _wait_gone([postmaster], signalled + STOP_BOUND_S) == []
        finally:
            second.kill()
    finally:
        first.kill()


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    path = Path(tempfile.mkdtemp(prefix="contentsvc-lifecycle-"))
    run = EmbeddedRun(path / "home", tmp_path_factory.mktemp("lifecycle") / "run.log")
    yield run
    run.process.send_signal(signal.SIGTERM)
    try:
        run.process.wait(timeout=STOP_BOUND_S)
    finally:
        run.kill()
        shutil.rmtree(path, ignore_errors=True)


def test_a_second_run_in_the_same_home_is_refused_naming_the_holder(running):
    # One `run` per home: the second exits non-zero at once, names the pid holding the home,
    # and never reports itself ready.
    started = time.monotonic()
    out = _cli("run", "--port", str(free_port()), home=running.home, timeout=REFUSAL_BOUND_S)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    assert out.returncode == EXIT_BUSY, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    refusal = [line for line in lines if line["event"] == "home_in_use"]
    assert refusal and refusal[0]["pid"] == running.process.pid
    assert f"in use by pid {running.process.pid}" in refusal[0]["message"]
    assert not [line for line in lines if line["event"] in ("contentsvc_ready", "embedded_postgres_started")]
    assert running.process.poll() is None and health_status(running.base_url) == 200  # the first one is untouched


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_busy_port_is_refused_with_a_clear_message(running, tmp_path, command):
    # The port of the running service, from another home: a clear error and a non-zero exit,
    # before any database is started (no pgdata appears) and without a restart loop.
    home = tmp_path / "other-home"
    out = _cli(command, "--port", str(running.port), home=home, timeout=REFUSAL_BOUND_S)
    assert out.returncode == EXIT_BUSY, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]
    refusal = [line for line in lines if line["event"] == "port_in_use"]
    assert refusal and refusal[0]["port"] == running.port
    assert f"cannot listen on 127.0.0.1:{running.port}" in refusal[0]["message"]
    assert not (home / "pgdata").exists()


@pytest.mark.parametrize("command", ["run", "serve"])
def test_an_address_not_of_this_machine_or_a_port_out_of_range_is_refused_clearly(tmp_path, command):
    # An unknown name and an address of no interface here (TEST-NET-1) are not a busy port: the
    # refusal names the host and how to choose one, before any database is started.
    home = tmp_path / "home"
    for host in ("nosuch.invalid", "192.0.2.1"):
        out = _cli(command, "--host", host, "--port", "8099", home=home, timeout=REFUSAL_BOUND_S)
        assert out.returncode == EXIT_BUSY, out.stderr
        refusal = [line for line in map(json.loads, out.stderr.splitlines()) if line["event"] == "host_not_local"]
        assert refusal and refusal[0]["host"] == host and "--host or CONTENTSVC_HOST" in refusal[0]["message"]
    # A port outside 1-65535 (or 0, which is not 'unset') is a usage error, never a traceback.
    for port in ("99999", "0", "http"):
        out = _cli(command, "--port", port, home=home, timeout=REFUSAL_BOUND_S)
        assert out.returncode == 2 and "--port: must be an integer from 1 to 65535" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert not (home / "pgdata").exists()


def test_a_home_that_cannot_be_written_is_refused_naming_it_before_anything_starts(tmp_path):
    # A home that is a file, one under a file, and one where no directory can be made (procfs) were
    # tracebacks from whichever process first wrote there; now one configuration line, exit 2.
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for home, problem in ((a_file, f"{a_file} is not a directory"),
                          (a_file / "home", f"cannot be created: {a_file} is not a directory"),
                          (Path("/proc/contentsvc-home"), "/proc/contentsvc-home cannot be created")):
        for command in (["run", "--port", "8099"], ["serve", "--port", "8099"],
                        ["keys", "create", "--init", "--org", "a", "--actions", "*", "--corpora", "*"]):
            out = _cli(*command, home=home, timeout=REFUSAL_BOUND_S)
            assert out.returncode == 2, (command, out.stderr)
            assert "configuration error: home (from CONTENTSVC_HOME): " in out.stderr and problem in out.stderr
            assert "Traceback" not in out.stderr
    assert a_file.read_text() == ""


def test_a_command_beside_the_run_says_it_joined_the_embedded_server(running):
    # The run started the embedded PostgreSQL; an operator's command in the same home shares that
    # server, and its log says so instead of reading as a second server started.
    started = [line for line in json_lines(running.log_path) if line.get("event") == "embedded_postgres_started"]
    assert started and started[0]["pid"] == _postmaster_pid(running.home)
    out = _cli("keys", "list", home=running.home)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    joined = [line for line in lines if line["event"] == "embedded_postgres_joined"]
    assert joined and joined[0]["pid"] == _postmaster_pid(running.home)
    assert not [line for line in lines if line["event"] == "embedded_postgres_started"]


def test_the_supervisor_restarts_a_dead_embedded_postgres(running):
    # The embedded server dies (SIGKILL to its postmaster): the supervisor starts it again on the
    # same socket, and the API answers health ok again without being restarted itself.
    api_before = [child.pid for child in psutil.Process(running.process.pid).children()]
    postmaster = _postmaster_pid(running.home)
    os.kill(postmaster, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        restarted = [line for line in json_lines(running.log_path) if line.get("event") == "embedded_postgres_restarted"]
        if restarted and health_status(running.base_url) == 200:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"not back:\n{running.log_path.read_text()[-3000:]}")
    assert _postmaster_pid(running.home) != postmaster
    died = [line for line in json_lines(running.log_path) if line.get("event") == "embedded_postgres_died"]
    assert len(died) == 1 and died[0]["process"] == "supervisor"
    assert [child.pid for child in psutil.Process(running.process.pid).children()] == api_before


def test_keys_create_refuses_a_fresh_home_unless_init(scratch):
    # Run from a directory with no home, `keys create` does not silently make a new database:
    # exit 2, naming the path and --init. With --init it creates it and says where it wrote.
    args = ("keys", "create", "--org", "o", "--actions", "*", "--corpora", "*", "--json")
    refused = _cli(*args, home=None, cwd=scratch)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "--init" in refused.stderr and str(scratch / ".contentsvc" / "pgdata") in refused.stderr
    assert not (scratch / ".contentsvc" / "pgdata").exists()
    for action in (("keys", "list"), ("keys", "revoke", "key_x")):  # nor do the other key commands
        out = _cli(*action, home=None, cwd=scratch)
        assert out.returncode == 2 and "there is no database yet" in out.stderr
    assert not (scratch / ".contentsvc" / "pgdata").exists()

    created = _cli(*args, "--init", home=None, cwd=scratch)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["secret"].startswith("csk_")
    assert f"database: embedded PostgreSQL in {scratch / '.contentsvc' / 'pgdata'}" in created.stderr
    # The command started the server only for itself, so it stopped it on its way out.
    assert not (scratch / ".contentsvc" / "pgdata" / "postmaster.pid").exists()


def test_keys_names_a_database_url_with_its_password_masked(database_url):
    # The database a key command used, said on stderr; a password in the URL is never printed.
    params = conninfo_to_dict(database_url)
    user, host, port = params.get("user", "postgres"), params["host"], params.get("port", 5432)
    if host.startswith("/"):  # the embedded server listens on a socket directory: a query parameter
        url = f"postgresql://{user}:hunter2-do-not-print@/{params['dbname']}?host={host}&port={port}"
    else:
        url = f"postgresql://{user}:hunter2-do-not-print@{host}:{port}/{params['dbname']}"
    out = _cli("keys", "list", home=None, CONTENTSVC_DATABASE_URL=url)
    assert out.returncode == 0, out.stderr
    said = [line for line in out.stderr.splitlines() if line.startswith("database: ")]
    assert said == [f"database: {url.replace('hunter2-do-not-print', '***')}"]
    assert "hunter2" not in out.stderr + out.stdout
