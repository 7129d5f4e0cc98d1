"""Ingest backpressure over HTTP, on a server of this module's own whose limit is 1 s
(CONTENTSVC_MAX_INGEST_BACKLOG): a stopped materializer (SIGSTOP) makes the backlog grow, the
ingest routes answer 429 `ingest_backlog` with Retry-After until it has caught up, and a stopped
embedding fold refuses nothing.

part 1 "Errors" (429 throttled, every error in the Error envelope); docs/decisions.md "Ingest
backlog"; api/backlog.py.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.conftest import (ServerProcess, assert_error, client_for, create_corpus, json_lines, key_for,
                            suspend_caught_up, text_command, until, wait_current, wait_resolved)


@pytest.fixture(scope="module")
def own_server(databases, tmp_path_factory):
    server = ServerProcess(databases.create(), tmp_path_factory.mktemp("backlog"),
                           extra_env={"CONTENTSVC_MAX_INGEST_BACKLOG": "1"})
    yield server
    server.stop()


@pytest.fixture
def client(own_server):
    with client_for(own_server, key_for(own_server.database_url, f"org-{uuid.uuid4().hex[:8]}")) as c:
        yield c


def ingest(client: httpx.Client, corpus: str, body: dict | None = None) -> httpx.Response:
    return client.post("/v0/records", json=body or text_command(corpus, uuid.uuid4().hex, "a backlog probe"))


def test_ingests_are_refused_while_the_folds_are_behind_and_accepted_once_they_catch_up(own_server, client):
    corpus = create_corpus(client)
    first = ingest(client, corpus)
    assert first.status_code == 202, first.text
    wait_resolved(client, first.json()["receipt_id"])

    materializer = suspend_caught_up(own_server, "materializer")
    try:
        # A fresh backlog is accepted: the limit is on the age of what waits, not on its size.
        assert ingest(client, corpus).status_code == 202
        # Read at most once a second: the age passes 1 s within about 2 s.
        refused = until(lambda: (r := ingest(client, corpus)).status_code == 429 and r, "a 429", timeout=20)
        body = assert_error(refused, 429, "ingest_backlog")
        assert body["retryable"] is True
        assert int(refused.headers["retry-after"]) >= 1
        refused_body = text_command(corpus, "refused", "refused, then sent again")
        assert_error(ingest(client, corpus, refused_body), 429, "ingest_backlog")
        batch = client.post("/v0/records/batch", json={"entries": [text_command(corpus, "b", "in a batch")]})
        assert_error(batch, 429, "ingest_backlog")
        withdrawal = client.post("/v0/records/withdrawals", json={
            "idempotency_key": uuid.uuid4().hex, "source": {"corpus_id": corpus, "namespace": "test", "record_key": "b"}})
        assert_error(withdrawal, 429, "ingest_backlog")
        # Reading is never refused.
        assert client.get(f"/v0/ingestion-receipts/{first.json()['receipt_id']}").status_code == 200
    finally:
        materializer.resume()

    # Caught up, the same command is accepted as a new one: a refusal stored nothing, not even its key.
    accepted = until(lambda: (r := ingest(client, corpus, refused_body)).status_code == 202 and r,
                     "ingest accepted again", timeout=30)
    resolved = wait_resolved(client, accepted.json()["receipt_id"])
    assert resolved["outcome"] == "created" and resolved["source"]["record_key"] == "refused"
    # The operator sees both turns in the API's log.
    events = [(line["event"], line["level"]) for line in json_lines(own_server.log_path)
              if line.get("event", "").startswith("ingest_backlog")]
    assert ("ingest_backlog", "warning") in events and ("ingest_backlog_cleared", "info") in events


def test_embedding_that_lags_refuses_nothing(own_server, client):
    # Enrichment lags by design (record.enriched says when it caught up); only the folds on the way
    # to searchable count.
    corpus = create_corpus(client)
    vectors = suspend_caught_up(own_server, "vectors")
    try:
        waiting = ingest(client, corpus)
        assert waiting.status_code == 202, waiting.text
        wait_current(client, wait_resolved(client, waiting.json()["receipt_id"]))
        time.sleep(2.5)  # the vectors fold's backlog is now older than the 1 s limit, twice over
        later = ingest(client, corpus)
        assert later.status_code == 202, later.text
    finally:
        vectors.resume()
