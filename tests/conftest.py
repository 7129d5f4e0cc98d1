"""Shared fixtures: a real PostgreSQL, fresh databases, a real server process.

The server is CONTENTSVC_TEST_DATABASE_URL when set (an admin URL: tests
create and drop their own databases on it), else an embedded PostgreSQL
started for the session under a temporary directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from contentsvc.auth import keys
from contentsvc.bench import running_bench
from contentsvc.outbound_http import verifying_context
from contentsvc.processes.children import supervised_children
from contentsvc.processes import local_service
from contentsvc.processes.local_service import LocalService, create_database, drop_database
from contentsvc.storage.migrations import migrate


# How many lock requests on a table wait (tests hold a table locked to keep requests in flight).
LOCK_WAITERS = ("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                " WHERE c.relname = %s AND NOT l.granted")


def pytest_report_header(config) -> str | None:
    bench = running_bench()
    if bench:  # one overlapped a run once and failed two of its tests on their waits
        return f"WARNING: a bench is running ({bench}); it takes the cores this run's waits are sized for"
    return None


@pytest.fixture(scope="session")
def admin_url():
    url = os.environ.get("CONTENTSVC_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from contentsvc.storage import embedded

    with tempfile.TemporaryDirectory(prefix="contentsvc-pg-") as home:
        server = embedded.start(Path(home))
        try:
            yield server.get_uri()
        finally:
            # Stopped before its files go: pgserver's own stop, at exit, found its data directory
            # removed and left the server running, one orphan per test session.
            embedded.stop(server)


class Databases:
    """Creates fresh, migrated databases on the test server and drops them afterwards.

    The migrations run once, into a template database; each fresh database is a copy of it
    (CREATE DATABASE ... TEMPLATE), the same schema without replaying every migration per test."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.created: list[str] = []
        self._template: str | None = None
        self._lock = threading.Lock()  # tests may create databases from a background thread too

    def create(self) -> str:
        with self._lock:
            if self._template is None:
                template = create_database(self.admin_url, "cstpl")
                self.created.append(template)
                migrate(template)  # closes its connection: a template must have none while copied
                self._template = conninfo_to_dict(template)["dbname"]
            url = create_database(self.admin_url, "cstest", template=self._template)
            self.created.append(url)
        return url

    def drop_all(self) -> None:
        for url in reversed(self.created):  # copies before their template
            drop_database(self.admin_url, url)


@pytest.fixture(scope="session")
def databases(admin_url):
    dbs = Databases(admin_url)
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def database_url(databases) -> str:
    """One migrated database shared by the session's tests (they use their own corpora and orgs)."""
    return databases.create()


class ServerProcess(LocalService):
    """`contentsvc run` as a user starts it, on its own port and database; its log and (unless
    given, for a restart on the same files) its home under log_dir."""

    def __init__(self, database_url: str, log_dir: Path, extra_env: dict[str, str] | None = None,
                 home: Path | None = None) -> None:
        tag = uuid.uuid4().hex[:8]
        super().__init__(database_url, log_dir / f"server-{tag}.log", home or log_dir / f"home-{tag}", extra_env,
                         ready_timeout=60)

    def children(self) -> dict[str, psutil.Process]:
        """The live supervised children by role: `api`, `projector:NAME`, `worker:NAME`."""
        return supervised_children(self.process.pid)


@pytest.fixture(scope="session")
def server(database_url, tmp_path_factory):
    proc = ServerProcess(database_url, tmp_path_factory.mktemp("server"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def replay_server(databases, tmp_path_factory):
    """A second `contentsvc run` on a database and home of its own, for the tests whose vector
    replay cuts over every Corpus of the deployment (the shared `server` stays undisturbed).
    They run one after another and each uses its own Organizations and Corpora. One per module,
    stopped with it: the processes alive at once stay few (each holds PostgreSQL connections)."""
    proc = ServerProcess(databases.create(), tmp_path_factory.mktemp("replay-server"))
    yield proc
    proc.stop()


def key_for(database_url: str, org: str, actions: str = "*", corpora: str = "*") -> str:
    """Creates an API key in that database the way `contentsvc keys create` does; returns the secret."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return keys.create_key(conn, org, keys.parse_actions(actions), keys.parse_corpora(corpora), None).secret


@pytest.fixture(scope="session")
def make_key(database_url):
    """key_for on the session's shared database."""
    return lambda org, actions="*", corpora="*": key_for(database_url, org, actions, corpora)


@pytest.fixture
def org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def api(server, make_key, org):
    """An HTTP client for a fresh Organization with an all-actions, all-corpora key."""
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {make_key(org)}"},
                      timeout=30, verify=TLS) as client:
        yield client


# Every client of the tests shares the process's one TLS context (the service's own, made once):
# httpx builds a new one for each client otherwise (36 ms of CPU here, loading the CA bundle),
# though every server here is plain HTTP on loopback, and the tests make thousands of clients.
TLS = verifying_context()


def client_for(server, secret: str) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30,
                        verify=TLS)


_HEALTH = httpx.Client(timeout=2, verify=TLS)  # for the tests' single looks at a running service


def health_status(base_url: str) -> int | None:
    return local_service.health_status(_HEALTH, base_url)


def wait_healthy(base_url: str, process=None, log_path: Path | None = None, timeout: float = 60.0,
                 status: int = 200) -> None:
    """local_service.wait_healthy, failing the test with the tail of `log_path` when it does not answer."""
    if (why := local_service.wait_healthy(base_url, process, timeout, status)) is not None:
        tail = log_path.read_text(errors="replace")[-4000:] if log_path else ""
        pytest.fail(f"{base_url} {why}:\n{tail}")


def create_corpus(client: httpx.Client, corpus_id: str | None = None, name: str = "Test corpus") -> str:
    body = {"idempotency_key": uuid.uuid4().hex, "name": name}
    if corpus_id:
        body["corpus_id"] = corpus_id
    r = client.post("/v0/corpora", json=body)
    assert r.status_code == 201, r.text
    return r.json()["corpus_id"]


def text_command(corpus_id: str, record_key: str, text: str, key: str | None = None, **extra) -> dict:
    return {
        "idempotency_key": key or uuid.uuid4().hex,
        "source": {"corpus_id": corpus_id, "namespace": "test", "record_key": record_key},
        "content": {"kind": "text", "text": text},
        **extra,
    }


def wait_resolved(client: httpx.Client, receipt_id: str, timeout: float = 30.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = client.get(f"/v0/ingestion-receipts/{receipt_id}")
        assert r.status_code == 200, r.text
        if r.json()["state"] == "resolved":
            return r.json()
        time.sleep(0.05)
    raise AssertionError(f"receipt {receipt_id} did not resolve")


def wait_current(client: httpx.Client, receipt: dict, timeout: float = 40.0) -> dict:
    """The resolved Receipt once its Version is current: part1 "States and transitions", a
    Version still building reports is_current false until it becomes current (searchable)."""
    deadline = time.time() + timeout
    while not (receipt.get("availability") or {}).get("is_current"):
        assert time.time() < deadline, f"receipt {receipt['receipt_id']} never became current: {receipt}"
        time.sleep(0.05)
        r = client.get(f"/v0/ingestion-receipts/{receipt['receipt_id']}")
        assert r.status_code == 200, r.text
        receipt = r.json()
    return receipt


def until(probe, what: str, timeout: float = 40.0):
    """probe()'s first truthy answer, polled every 0.1 s; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


async def until_async(condition, what: str, timeout: float = 30.0, every: float = 0.05):
    """condition()'s first truthy answer, polled every `every` s without blocking the event loop;
    fails naming `what` after `timeout` s."""
    for _ in range(int(timeout / every)):
        value = condition()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"timed out waiting until {what}")


def suspend_caught_up(server: ServerProcess, fold: str) -> psutil.Process:
    """SIGSTOP a fold (`materializer`, `lexical` ...) once its checkpoint (its serving generation's,
    for an index fold) has reached the journal's head. Stopped in the middle of a step, it could
    hold the journal lock (between sending its append and its COMMIT), and every ingest would
    wait on it and fail storage_unavailable instead of answering what is tested."""
    with psycopg.connect(server.database_url, autocommit=True) as conn:
        until(lambda: conn.execute(
            "SELECT c.position >= (SELECT max(position) FROM journal) FROM projector_checkpoints c"
            " WHERE c.name = %s OR c.name IN (SELECT kind || ':' || generation_id FROM search_generations"
            "                                 WHERE kind = %s AND state = 'serving')",
            (fold, fold)).fetchone()[0], f"the {fold} fold caught up")
    process = server.children()[f"projector:{fold}"]
    process.suspend()
    return process


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    """The Error envelope of part 1, exactly: no other member, no stack trace."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["code"] == code, body
    assert set(body) <= {"code", "message", "retryable", "field", "resync_url"}
    assert isinstance(body["message"], str) and body["message"]
    assert isinstance(body["retryable"], bool)
    assert "Traceback" not in response.text
    return body


def json_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def status_table_rows(stdout: str, named_by: str = "projector") -> list[dict[str, str]]:
    """The rows of the first table of `contentsvc projector status` (or of `worker status`,
    `named_by` "worker"), by column title (the title row is drawn with "┃", the rows with "│"; a
    wrapped cell's continuation rows have no name). The tables beneath it (faults, generations
    being built) are not read: the first ends at its bottom rule ("└")."""
    def cells(line: str, rule: str) -> list[str]:
        return [cell.strip() for cell in line.split(rule)[1:-1]]

    lines = stdout.splitlines()
    first = lines[:next((i for i, line in enumerate(lines) if line.startswith("└")), len(lines))]
    titles = next(cells(line, "┃") for line in first if "┃" in line)
    rows = [dict(zip(titles, cells(line, "│"))) for line in first if "│" in line]
    return [row for row in rows if row[named_by]]


def operator_cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    """`contentsvc ARGS` as an operator runs it against that database."""
    return subprocess.run([sys.executable, "-m", "contentsvc.cli", *args], capture_output=True, text=True,
                          env=dict(os.environ, CONTENTSVC_DATABASE_URL=database_url), timeout=60)


def worker_status_rows(database_url: str) -> dict[str, dict[str, str]]:
    """`contentsvc worker status` on that database, its rows by worker."""
    out = operator_cli(database_url, "worker", "status")
    assert out.returncode == 0, out.stderr
    return {row["worker"]: row for row in status_table_rows(out.stdout, named_by="worker")}
