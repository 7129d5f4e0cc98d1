"""A search past its profile's `max_latency_ms` answers 504 `search_deadline_exceeded` (part 1 rule 20).

The session's real `contentsvc run`. The test stalls the search's
canonical hydration from outside, the way a slow or locked database does:
it holds an ACCESS EXCLUSIVE lock on `versions` while searches run. Each
search must then answer the Error envelope with 504 once the profile's
budget is spent (not a 500, not empty hits, not a reply only when the lock
goes), and the same searches answer their hits again once it is released.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from tests.conftest import (
    assert_error,
    client_for,
    create_corpus,
    text_command,
    wait_resolved,
)

TEXT = "Vaccines prevent measles infection in children."
QUERIES = {"lexical": "measles vaccines", "semantic": "immunization of kids", "hybrid": "measles in children"}


@pytest.fixture(scope="module")
def deployment(server, make_key):
    """The session's server and a key of an Organization of its own. The test locks one of the
    shared database's tables for a few seconds: tests run one at a time, so only the server's
    background folds meet the lock, and they wait for it like any writer would."""
    with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as api:
        yield server, api


def search(api, corpus: str, mode: str):
    return api.post("/v0/search", json={"query": QUERIES[mode], "corpus_ids": [corpus], "mode": mode, "limit": 3})


def wait_found_in_every_mode(api, corpus: str, record_id: str, timeout: float = 60.0) -> None:
    """Searchable, embedded, and in the vector snapshot the API serves (it trails enrichment)."""
    deadline = time.time() + timeout
    pending = set(QUERIES)
    while pending:
        for mode in list(pending):
            r = search(api, corpus, mode)
            if r.status_code == 200 and [h["record_id"] for h in r.json()["items"]] == [record_id]:
                pending.discard(mode)
        assert time.time() < deadline, f"not found by {pending}"
        time.sleep(0.2)


def test_a_search_past_the_profile_deadline_answers_504(deployment):
    # part 1 rule 20: "A profile has a `max_latency_ms`; exceeding it is 504 `search_deadline_exceeded`";
    # rule 21: the profile list states that budget.
    server, api = deployment
    profiles = api.get("/v0/search/profiles")
    assert profiles.status_code == 200, profiles.text
    [default] = [p for p in profiles.json()["items"] if p["default"]]
    budget = default["max_latency_ms"] / 1000
    assert default["name"] == "default" and budget > 0

    corpus = create_corpus(api)
    r = api.post("/v0/records", json=text_command(corpus, "vaccine", TEXT))
    assert r.status_code == 202, r.text
    record_id = wait_resolved(api, r.json()["receipt_id"])["record_id"]
    wait_found_in_every_mode(api, corpus, record_id)

    with psycopg.connect(server.database_url) as stall:
        stall.execute("SET lock_timeout = '5s'")
        stall.execute("LOCK TABLE versions IN ACCESS EXCLUSIVE MODE")
        # The lock is held until every search below has answered: only the deadline can answer them.
        for mode in QUERIES:
            started = time.monotonic()
            r = search(api, corpus, mode)
            took = time.monotonic() - started
            body = assert_error(r, 504, "search_deadline_exceeded")
            assert body["retryable"] is True
            assert str(default["max_latency_ms"]) in body["message"]
            # Answered when the budget was spent, not when the stall ended.
            assert budget <= took < budget + 2.0, (mode, took)
        stall.rollback()

    # The cancelled searches left the server sound: the same searches find the Record again.
    for mode in QUERIES:
        r = search(api, corpus, mode)
        assert r.status_code == 200, r.text
        assert [h["record_id"] for h in r.json()["items"]] == [record_id], (mode, r.json())
