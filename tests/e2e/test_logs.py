"""A whole run's output, as an operator's log shipper reads it: start, requests (good and bad),
a search, an idempotency conflict, SIGTERM. Every line of every process is one JSON object with
a `process` field, and none carries the API key's secret or a value from a request body
(decisions.md "Logs"; part1 "Errors": never a stack trace to a client, never a secret in a log)."""

from __future__ import annotations

import json
import uuid

import httpx

from contentsvc.processes.registry import API, PROCESSES
from tests.conftest import ServerProcess, client_for, create_corpus, key_for, text_command, wait_resolved


def _marker(name: str) -> str:
    return f"{name}{uuid.uuid4().hex[:12]}"


def test_every_line_of_a_whole_run_is_json_with_its_process_and_no_secret_or_body(databases, tmp_path):
    # A database of its own: index generations live in the server's home, so a database another
    # server built generations in would route this one's searches to files it does not have.
    database_url = databases.create()
    server = ServerProcess(database_url, tmp_path)
    org = f"org-{uuid.uuid4().hex[:8]}"
    secret = key_for(database_url, org)
    markers = {name: _marker(name) for name in ("text", "badfield", "malformed", "bogus", "conflict", "query")}
    try:
        with client_for(server, secret) as api:
            corpus = create_corpus(api)
            first = text_command(corpus, "r1", f"Otters {markers['text']} float.")
            accepted = api.post("/v0/records", json=first)
            assert accepted.status_code == 202, accepted.text
            wait_resolved(api, accepted.json()["receipt_id"])
            # A body the schema refuses, a body that is not JSON, a conflicting reuse of an
            # idempotency key: each answers with the Error envelope and leaves no value in the log.
            bad = api.post("/v0/records", json={"idempotency_key": markers["badfield"], "source": markers["badfield"]})
            assert bad.status_code == 422, bad.text
            malformed = api.post("/v0/records", content=f'{{"idempotency_key": "{markers["malformed"]}',
                                 headers={"content-type": "application/json"})
            assert malformed.status_code == 400, malformed.text
            conflict = api.post("/v0/records", json={**first, "content": {"kind": "text", "text": markers["conflict"]}})
            assert conflict.status_code in (409, 422), conflict.text
            # A search: its query must stay out of the log.
            searched = api.post("/v0/search", json={"query": markers["query"], "corpus_ids": [corpus],
                                                    "mode": "lexical"})
            assert searched.status_code == 200, searched.text
        bogus = httpx.get(f"{server.base_url}/v0/corpora", headers={"Authorization": f"Bearer csk_{markers['bogus']}"})
        assert bogus.status_code == 401
        # A path no route matches and a method no route takes are requests too: logged, with an id.
        unrouted = httpx.get(f"{server.base_url}/v0/nowhere")
        wrong_method = httpx.delete(f"{server.base_url}/v0/corpora")
        assert (unrouted.status_code, wrong_method.status_code) == (404, 405)
    finally:
        server.stop()

    raw = server.log_path.read_text()
    lines = [json.loads(line) for line in raw.splitlines()]  # every line, not only those that look like JSON
    assert all(isinstance(line, dict) and line.get("process") for line in lines)
    expected = {"supervisor"} | {kind.name if kind.role == API else f"{kind.role}:{kind.name}" for kind in PROCESSES}
    assert {line["process"] for line in lines} == expected
    assert any(line["event"] == "contentsvc_stopped" for line in lines)
    requests = {(line["method"], line["route"]): line for line in lines if line["event"] == "request"}
    for (method, route), response in ((("GET", "/v0/nowhere"), unrouted), (("DELETE", "/v0/corpora"), wrong_method)):
        assert requests[(method, route)]["status"] == response.status_code
        assert requests[(method, route)]["request_id"] == response.headers["x-request-id"]
    assert secret not in raw and secret.removeprefix("csk_") not in raw
    for name, value in markers.items():
        assert value not in raw, f"the {name} value reached the log"
