"""requestConnectorRun and its idempotency key (decisions-part2 "Connector management": an existing
queued run is returned instead of a second one; part 1 idempotency: a replayed request gets the
first answer).

`serve` runs without the `connectors` worker at first, so a requested run stays queued for as long
as the test needs (and no scheduled one is queued); the worker is started for the second half."""

from __future__ import annotations

import time

import httpx

from tests.conftest import create_corpus
from tests.integration.stack import Stack


def request_run(c: httpx.Client, connector_id: str, key: str) -> dict:
    r = c.post(f"/v0/connectors/{connector_id}/runs", json={"idempotency_key": key})
    assert r.status_code == 202, r.text
    return r.json()


def runs(c: httpx.Client, connector_id: str) -> list[dict]:
    return c.get(f"/v0/connectors/{connector_id}/runs").json()["items"]


def test_a_replayed_run_request_answers_the_run_it_was_first_answered_with(databases, tmp_path):
    config = tmp_path / "contentsvc.toml"
    config.write_text("[connectors]\nfixture_enabled = true\ninterval_floor_seconds = 1\n")
    stack = Stack(databases.create(), tmp_path, ("materializer", "readmodel"), CONTENTSVC_CONFIG=str(config))
    worker = None
    try:
        c = stack.client
        create_corpus(c, "feeds")
        r = c.post("/v0/connectors", json={
            "idempotency_key": "c1", "corpus_id": "feeds", "source_namespace": "fx", "kind": "fixture",
            "config": {"items": [{"record_key": "one", "revision": "1", "text": "one item"}]}})
        assert r.status_code == 201, r.text
        connector_id = r.json()["connector_id"]

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
        worker = stack.spawn(["worker", "run", "connectors"])
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
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        stack.close()
