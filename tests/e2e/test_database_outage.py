"""A frozen or stopped PostgreSQL: every edge answers clearly, nothing acknowledged is lost.

A real `contentsvc run` on an embedded PostgreSQL of its own (pgserver, started here):
the test freezes that server (SIGSTOP on the postmaster and its backends), then stops
it with `pg_ctl stop -m fast` and starts it again on the same data directory. The
shared test server is never touched.

docs/decisions.md "A slow or dead database" states the bounds checked here: health
answers 503 within 2 s, any other request 503 storage_unavailable with Retry-After
within unresponsive_seconds + 1 s (8 s by default), and each process logs one
`database_unavailable` line per outage and one `database_available` when it ends.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pgserver
import pytest

from contentsvc.config.environment import child_environment
from contentsvc.processes.local_service import free_port
from contentsvc.processes.registry import PROCESSES, PROJECTOR
from tests.conftest import (
    ServerProcess,
    assert_error,
    client_for,
    create_corpus,
    json_lines,
    key_for,
    text_command,
    wait_healthy,
    wait_resolved,
)

HEALTH_BOUND_S = 2.0
REQUEST_BOUND_S = 8.0  # unresponsive_seconds (7) + 1
MARGIN_S = 1.0  # a loaded test machine
PROJECTOR_PROCESSES = sorted(f"{k.role}:{k.name}" for k in PROCESSES if k.role == PROJECTOR)


class EmbeddedPostgres:
    """A PostgreSQL of this test's own, which it may freeze and stop."""

    def __init__(self, home: Path) -> None:
        # pgserver logs again from its exit handler, after pytest has closed the stream its
        # handler writes to ("--- Logging error ---" at the end of the run): quiet, as the
        # service keeps it (storage/database.start_embedded).
        logging.getLogger("pgserver").setLevel(logging.CRITICAL)
        self.pgdata = home / "pgdata"
        self.server = pgserver.get_server(self.pgdata, cleanup_mode="stop")
        self.url = self.server.get_uri()
        self.frozen: list[int] = []

    def processes(self) -> list[int]:
        """The postmaster (first) and its children, from postmaster.pid and /proc."""
        postmaster = int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        self.frozen = self.processes()
        for pid in self.frozen:
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in reversed(self.frozen):
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen = []

    def stop(self) -> None:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.pgdata, user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()
        assert self.server.get_uri() == self.url

    def close(self) -> None:
        self.thaw()
        self.server.cleanup()


@pytest.fixture(scope="module")
def outage(tmp_path_factory):
    # The data directory lives outside pytest's temporary root: the server runs as another
    # user, and each pytest session starting on this machine makes that root private again.
    pg_home = Path(tempfile.mkdtemp(prefix="contentsvc-outage-"))
    postgres = EmbeddedPostgres(pg_home)
    service = None
    try:
        service = ServerProcess(postgres.url, tmp_path_factory.mktemp("outage"))
        secret = key_for(postgres.url, "outage")
        with client_for(service, secret) as api:
            yield postgres, service, api
    finally:
        postgres.thaw()
        if service is not None:
            service.stop()
        postgres.close()
        shutil.rmtree(pg_home, ignore_errors=True)


def timed(call):
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def assert_unavailable(response: httpx.Response) -> int:
    assert_error(response, 503, "storage_unavailable")
    assert response.json()["retryable"] is True
    retry_after = int(response.headers["Retry-After"])
    assert 1 <= retry_after <= 10
    return retry_after


def lines_of(service, event: str) -> list[dict]:
    return [line for line in json_lines(service.log_path) if line.get("event") == event]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return result


def test_a_frozen_database_answers_503_within_bounds_and_loses_nothing(outage):
    # part1 "A dependency outage is always an error, never an empty success"; Error retryable with
    # Retry-After; docs/decisions.md "A slow or dead database": health 503 within 2 s, others within 8 s.
    postgres, service, api = outage
    corpus = create_corpus(api)
    r = api.post("/v0/records", json=text_command(corpus, "before", "acknowledged before the freeze"))
    assert r.status_code == 202, r.text
    acknowledged = r.json()["receipt_id"]
    record_id = wait_resolved(api, acknowledged)["record_id"]

    postgres.freeze()
    try:
        # Issued at once, together: some hold pooled connections before anything noticed the freeze.
        with ThreadPoolExecutor(3) as pool:
            health = pool.submit(timed, lambda: httpx.get(f"{service.base_url}/v0/health", timeout=30))
            ingest = pool.submit(timed, lambda: api.post(
                "/v0/records", json=text_command(corpus, "during", "sent while the database is frozen")))
            read = pool.submit(timed, lambda: api.get(f"/v0/records/{record_id}"))
            (health_r, health_s), (ingest_r, ingest_s), (read_r, read_s) = (
                health.result(), ingest.result(), read.result())
        assert_unavailable(health_r)
        assert health_s < HEALTH_BOUND_S + MARGIN_S, health_s
        for response, took in ((ingest_r, ingest_s), (read_r, read_s)):
            assert_unavailable(response)
            assert took < REQUEST_BOUND_S + MARGIN_S, took
        # Once the service has seen the freeze, it answers at once.
        again, again_s = timed(lambda: api.get(f"/v0/records?corpus_id={corpus}"))
        assert_unavailable(again)
        assert again_s < HEALTH_BOUND_S, again_s
        print(f"frozen: health 503 in {health_s:.2f} s, ingest in {ingest_s:.2f} s, read in {read_s:.2f} s,"
              f" later read in {again_s:.2f} s, Retry-After {again.headers['Retry-After']}")
    finally:
        postgres.thaw()

    # It recovers by itself, and what it acknowledged is there.
    service.wait_ready(timeout=20)
    r = wait_for(lambda: (r := api.get(f"/v0/records/{record_id}")).status_code == 200 and r, 20,
                 "the acknowledged Record did not come back")
    assert r.json()["record_id"] == record_id
    assert api.get(f"/v0/ingestion-receipts/{acknowledged}").json()["state"] == "resolved"
    r = api.post("/v0/records", json=text_command(corpus, "after", "sent after the thaw"))
    assert r.status_code == 202, r.text
    wait_resolved(api, r.json()["receipt_id"])


def read_stream(service, secret_headers: dict, corpus: str, opened: threading.Event, out: list) -> None:
    """The events of one change stream, until the server ends it (or 30 s pass)."""
    with httpx.stream("GET", f"{service.base_url}/v0/changes/stream", params={"corpus_id": corpus},
                      headers=secret_headers, timeout=httpx.Timeout(30.0)) as r:
        out.append(r.status_code)
        event = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line.partition(":")[2].strip()
                opened.set()
            elif line.startswith("data:") and event is not None:
                out.append((event, line.partition(":")[2].strip()))


def test_a_stopped_database_ends_streams_and_is_waited_out_by_every_process(outage):
    # part1 rule 19: a stream that cannot go on ends with a stream_error event carrying the Error;
    # docs/decisions.md "A slow or dead database": one database_unavailable line per process, no
    # traceback, back by itself when PostgreSQL is.
    postgres, service, api = outage
    corpus = create_corpus(api)
    opened, events = threading.Event(), []
    reader = threading.Thread(target=read_stream, args=(service, dict(api.headers), corpus, opened, events))
    reader.start()
    assert opened.wait(10), events
    unavailable_before = len(lines_of(service, "database_unavailable"))
    available_before = len(lines_of(service, "database_available"))

    postgres.stop()
    stopped_at = time.monotonic()
    try:
        reader.join(timeout=20)
        assert not reader.is_alive(), "the stream was not ended"
        assert events[0] == 200
        name, data = events[-1]
        assert name == "stream_error", events
        error = json.loads(data)
        assert error["code"] == "storage_unavailable" and error["retryable"] is True, error
        assert set(error) <= {"code", "message", "retryable", "field", "resync_url"}

        assert_unavailable(api.get(f"/v0/records?corpus_id={corpus}"))

        def every_process_noted_it():
            lines = lines_of(service, "database_unavailable")[unavailable_before:]
            return {line["process"] for line in lines} >= {*PROJECTOR_PROCESSES, "api"} and lines
        wait_for(every_process_noted_it, 20, "not every process logged database_unavailable")
        # Retries go on with backoff, silently: still one line per process after a few of them.
        time.sleep(max(0.0, 4.0 - (time.monotonic() - stopped_at)))
        lines = lines_of(service, "database_unavailable")[unavailable_before:]
        processes = [line["process"] for line in lines]
        assert sorted(processes) == sorted({*processes}), processes
        assert all(line["level"] == "warning" for line in lines)
    finally:
        postgres.start()

    def every_process_is_back():
        lines = lines_of(service, "database_available")[available_before:]
        return {line["process"] for line in lines} >= {*PROJECTOR_PROCESSES, "api"}
    wait_for(every_process_is_back, 30, "not every process logged database_available")
    log_text = service.log_path.read_text(errors="replace")
    assert "Traceback" not in log_text
    assert not lines_of(service, "child_exited")  # waited out, not restarted

    # The service processes a new ingest to the end.
    service.wait_ready(timeout=20)
    r = wait_for(lambda: (r := api.post("/v0/records", json=text_command(
        corpus, "back", "after the restart", key="back-after-restart"))).status_code == 202 and r, 20, "ingest not accepted again")
    assert wait_resolved(api, r.json()["receipt_id"])["state"] == "resolved"


def test_the_api_started_during_an_outage_waits_it_out(outage, tmp_path):
    # docs/decisions.md "A slow or dead database": a process started while PostgreSQL is away
    # logs one database_unavailable line and waits, instead of exiting with a traceback.
    postgres, _, _ = outage
    port = free_port()
    log_path = tmp_path / "serve.log"
    postgres.stop()
    try:
        with open(log_path, "wb") as log:
            serve = subprocess.Popen(
                [sys.executable, "-m", "contentsvc.cli", "serve", "--no-migrate", "--port", str(port)],
                env=child_environment(CONTENTSVC_DATABASE_URL=postgres.url, CONTENTSVC_HOME=str(tmp_path / "home")),
                stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: any(line.get("event") == "database_unavailable" for line in json_lines(log_path)),
                     20, "no database_unavailable line from the starting API")
            time.sleep(3.0)  # a few retries later: still running, still one line
            assert serve.poll() is None, log_path.read_text()
            lines = [line for line in json_lines(log_path) if line.get("event") == "database_unavailable"]
            assert [line["process"] for line in lines] == ["api"]
            postgres.start()
            wait_healthy(f"http://127.0.0.1:{port}", serve, log_path, 30)
            assert "Traceback" not in log_path.read_text()
            assert any(line.get("event") == "database_available" for line in json_lines(log_path))
        finally:
            serve.terminate()
            serve.wait(timeout=15)
    finally:
        postgres.start()
