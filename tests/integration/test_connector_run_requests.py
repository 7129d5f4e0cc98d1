"""requestConnectorRun and its idempotency key (decisions-part2 "Connector management": an existing
queued run is returned instead of a second one; part 1 idempotency: a replayed request gets the
first answer), and how commands and the `connectors` worker take turns on a Connector
(docs/decisions.md "Connectors").

`serve` runs without the `connectors` worker at first, so a requested run stays queued for as long
as a test needs (and no scheduled one is queued); a test starts the worker when it needs it, or
holds a transaction that stands for the worker or for a command at the moment they meet."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

from contentsvc.projectors.runner import runner_application_name
from tests.conftest import create_corpus, until
from tests.integration.stack import Stack


def request_run(c: httpx.Client, connector_id: str, key: str) -> dict:
    r = c.post(f"/v0/connectors/{connector_id}/runs", json={"idempotency_key": key})
    assert r.status_code == 202, r.text
    return r.json()


def runs(c: httpx.Client, connector_id: str) -> list[dict]:
    return c.get(f"/v0/connectors/{connector_id}/runs").json()["items"]


@pytest.fixture
def stack(databases, tmp_path):
    """`serve`, the materializer and the read model, without the `connectors` worker: a test starts
    it (start_worker) when it needs it, or stands for it."""
    config = tmp_path / "contentsvc.toml"
    config.write_text("[connectors]\nfixture_enabled = true\ninterval_floor_seconds = 1\n")
    s = Stack(databases.create(), tmp_path, ("materializer", "readmodel"), CONTENTSVC_CONFIG=str(config))
    yield s
    s.close()  # the worker too: it is one of its processes


def start_worker(stack: Stack) -> None:
    stack.projectors["connectors"] = stack.spawn(["worker", "run", "connectors"])


def fixture_connector(stack: Stack) -> str:
    create_corpus(stack.client, "feeds")
    r = stack.client.post("/v0/connectors", json={
        "idempotency_key": "c1", "corpus_id": "feeds", "source_namespace": "fx", "kind": "fixture",
        "config": {"items": [{"record_key": "one", "revision": "1", "text": "one item"}]}})
    assert r.status_code == 201, r.text
    return r.json()["connector_id"]


def until_waiting_on_a_lock(url: str, application_name: str) -> None:
    """Returns once a backend of `application_name` waits for a lock (one a test transaction holds)."""
    with psycopg.connect(url, autocommit=True) as watcher:
        until(lambda: watcher.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = %s"
                                      " AND wait_event_type = 'Lock'", (application_name,)).fetchone(),
              f"a {application_name} backend waiting for a lock", timeout=20)


def insert_run(conn: psycopg.Connection, connector_id: str, run_id: str, state: str) -> None:
    conn.execute("INSERT INTO connector_runs (run_id, connector_id, org_id, corpus_id, trigger, state, run_at)"
                 " SELECT %s, connector_id, org_id, corpus_id, 'request', %s, now() FROM connectors"
                 " WHERE connector_id = %s", (run_id, state, connector_id))


def test_a_replayed_run_request_answers_the_run_it_was_first_answered_with(stack):
    c = stack.client
    connector_id = fixture_connector(stack)

    queued = request_run(c, connector_id, "first")
    assert request_run(c, connector_id, "first") == queued
    # A request while a run is queued is answered with that run, and so is its replay (it was a
    # 500: the key recorded a run that was never made).
    while_queued = request_run(c, connector_id, "while-queued")
    assert while_queued == queued
    assert request_run(c, connector_id, "while-queued") == queued
    [run] = runs(c, connector_id)
    assert (run["run_id"], run["state"], run["trigger"]) == (queued["run_id"], "queued", "request")

    # Once nothing is queued, a request makes a run of its own, which its replay answers too.
    start_worker(stack)
    deadline = time.monotonic() + 30
    while any(r["state"] in ("queued", "running") for r in runs(c, connector_id)):
        assert time.monotonic() < deadline, stack.log_path.read_text()[-3000:]
        time.sleep(0.1)
    requested = request_run(c, connector_id, "after")
    assert requested["run_id"] != queued["run_id"]
    assert request_run(c, connector_id, "after") == requested
    assert request_run(c, connector_id, "while-queued")["run_id"] == queued["run_id"]
    newest = runs(c, connector_id)[0]
    assert (newest["run_id"], newest["trigger"]) == (requested["run_id"], "request")


def test_a_run_request_beside_a_scheduled_run_being_queued_answers_that_run(stack):
    # decisions-part2 "Connector management": an existing queued run is returned instead of a second
    # one, also when the worker is queueing its scheduled run at that moment (it was a 500: the
    # request, serialized on a lock the worker does not take, inserted a second queued run and
    # failed on the one-queued-run index once the worker committed).
    connector_id = fixture_connector(stack)
    with psycopg.connect(stack.url) as worker:  # as the worker's queue_scheduled, mid-transaction
        worker.execute("SELECT 1 FROM connectors WHERE connector_id = %s FOR UPDATE SKIP LOCKED", (connector_id,))
        insert_run(worker, connector_id, "run_scheduled", "queued")
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(stack.client.post, f"/v0/connectors/{connector_id}/runs",
                                 json={"idempotency_key": "beside-the-schedule"})
            until_waiting_on_a_lock(stack.url, "contentsvc api")
            worker.commit()
            r = answer.result(timeout=30)
    assert r.status_code == 202, r.text
    assert r.json()["run_id"] == "run_scheduled"
    assert [run["run_id"] for run in runs(stack.client, connector_id)] == ["run_scheduled"]


def test_the_worker_starting_a_run_never_waits_for_a_command_holding_its_connector(stack):
    # decisions-part2 "Connector management" (disable skips queued runs): a disable holding the
    # Connector while the worker started its queued run deadlocked (the worker held the run and waited
    # for the Connector, the disable held the Connector and waited for the run), and PostgreSQL
    # aborted one of them: a 503 for the disable, or a worker fault.
    connector_id = fixture_connector(stack)
    queued = request_run(stack.client, connector_id, "to-start")
    with psycopg.connect(stack.url) as command:  # as disableConnector, mid-transaction
        command.execute("SET deadlock_timeout = '100ms'")
        command.execute("SELECT 1 FROM connectors WHERE connector_id = %s FOR UPDATE", (connector_id,))
        start_worker(stack)
        time.sleep(3.5)  # the worker polls for due runs every second: three polls while the command holds on
        skipped = command.execute("UPDATE connector_runs SET state = 'skipped', notice = 'connector_disabled',"
                                  " finished_at = now() WHERE connector_id = %s AND state = 'queued'"
                                  " RETURNING run_id", (connector_id,)).fetchall()
        command.commit()
    assert skipped == [(queued["run_id"],)]
    assert [(r["run_id"], r["state"]) for r in runs(stack.client, connector_id)] == [(queued["run_id"], "skipped")]
    assert stack.log_count("projector_faulted") == 0, stack.log_path.read_text()[-3000:]


def test_a_worker_starting_beside_a_run_request_requeues_or_skips_what_was_left_running(stack):
    # decisions-part2 "Runs": a run a killed worker left running is queued again when a worker starts,
    # unless a run is queued already (then it is skipped, run_in_progress). A run request committing
    # while the worker started used to be met on the one-queued-run index: a fault at every start.
    connector_id = fixture_connector(stack)
    with psycopg.connect(stack.url) as command:
        insert_run(command, connector_id, "run_left_running", "running")  # what a killed worker left
        command.commit()
        # as requestConnectorRun, mid-transaction
        command.execute("SELECT 1 FROM connectors WHERE connector_id = %s FOR UPDATE", (connector_id,))
        insert_run(command, connector_id, "run_requested", "queued")
        start_worker(stack)
        until_waiting_on_a_lock(stack.url, runner_application_name("connectors"))
        command.commit()
    deadline = time.monotonic() + 30
    while {r["run_id"]: r["state"] for r in runs(stack.client, connector_id)}.get("run_requested") != "succeeded":
        assert time.monotonic() < deadline, stack.log_path.read_text()[-3000:]
        time.sleep(0.1)
    left = next(r for r in runs(stack.client, connector_id) if r["run_id"] == "run_left_running")
    assert left["state"] == "skipped"
    assert stack.log_count("projector_faulted") == 0, stack.log_path.read_text()[-3000:]
