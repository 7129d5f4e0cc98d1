"""The first user story: a Corpus, one Record, its Receipt resolving."""

from tests.conftest import create_corpus, text_command, wait_resolved


def test_ingest_resolves_created(api):
    corpus = create_corpus(api)
    r = api.post("/v0/records", json=text_command(corpus, "a", "Hello world"))
    assert r.status_code == 202  # part1 rule 1
    receipt = r.json()
    assert r.headers["location"] == f"/v0/ingestion-receipts/{receipt['receipt_id']}"
    resolved = wait_resolved(api, receipt["receipt_id"])
    assert resolved["outcome"] == "created"
    # materialized at resolution; the lexical projector may already have moved it on
    assert resolved["availability"]["state"] in ("materialized", "building_baseline", "retrieval_ready")
