"""Semantic and hybrid search over the engine's MiniLM space (part1 rules 16 and 20, issue: search)."""

import os
import subprocess
import sys
import time

from tests.conftest import client_for, create_corpus, key_for, text_command

TEXTS = {
    "vaccine": "Vaccines prevent measles infection in children.",
    "markets": "Stock markets fell sharply on inflation fears.",
    "fox": "The quick brown fox jumps over the lazy dog.",
}


def wait_enriched(api, receipt_ids: list[str], timeout: float = 120) -> None:
    """Searchable first (lexical), then enrichment ends: processing idle with a vector space."""
    deadline = time.time() + timeout
    pending = set(receipt_ids)
    while pending and time.time() < deadline:
        for rid in list(pending):
            r = api.get(f"/v0/ingestion-receipts/{rid}").json()
            if (r.get("availability") or {}).get("searchable") and r["processing"]["state"] == "idle":
                pending.discard(rid)
        time.sleep(0.2)
    assert not pending, f"not enriched: {pending}"


def semantic_top(api, corpus: str, query: str, expect: int = 1, timeout: float = 30) -> dict:
    """The first semantic hit, once `expect` Records are found. The API serves the vector
    index's latest snapshot, which trails enrichment by up to the snapshot interval
    (docs/architecture.md, Search)."""
    deadline = time.time() + timeout
    while True:
        r = api.post("/v0/search", json={"query": query, "corpus_ids": [corpus], "mode": "semantic", "limit": 3})
        assert r.status_code == 200, r.text
        if len(r.json()["items"]) >= expect or time.time() > deadline:
            return r.json()["items"][0]
        time.sleep(0.2)


def test_semantic_hybrid_coverage_and_vector_replay(replay_server):
    # Not the shared server: the vector replay below cuts over every Corpus of the deployment.
    with client_for(replay_server, key_for(replay_server.database_url, "semantic")) as api:
        _scenario(replay_server, api)


def _scenario(server, api):
    corpus = create_corpus(api)
    receipts = {k: api.post("/v0/records", json=text_command(corpus, k, t)).json()["receipt_id"]
                for k, t in TEXTS.items()}
    wait_enriched(api, list(receipts.values()))
    records = {k: api.get(f"/v0/ingestion-receipts/{rid}").json()["record_id"] for k, rid in receipts.items()}

    # Meaning, not words: no query term occurs in the text it finds.
    hit = semantic_top(api, corpus, "immunization of kids", expect=3)
    assert hit["record_id"] == records["vaccine"]
    assert hit["explanation"]["semantic_rank"] == 1 and "lexical_rank" not in hit["explanation"]
    part = api.get(f"/v0/records/{hit['record_id']}/versions/{hit['version_id']}").json()["manifest"]["parts"][0]
    assert part["content"]["text"][hit["excerpt"]["start"]:hit["excerpt"]["end"]] == hit["excerpt"]["text"]

    # Hybrid fuses both rankings: a Version found first by both ranks first, under the default
    # profile's z-score fusion and under the `rrf` profile's reciprocal-rank fusion (k = 10).
    for profile in ("default", "rrf"):
        r = api.post("/v0/search", json={"query": "lazy dog", "corpus_ids": [corpus], "limit": 3,
                                         "profile": profile}).json()
        assert r["retrieval_profile"]["name"] == profile
        top = r["items"][0]
        assert top["record_id"] == records["fox"]
        assert top["explanation"]["lexical_rank"] == 1 and top["explanation"]["semantic_rank"] == 1
    assert top["explanation"]["score"] == round(2 / (10 + 1), 6)

    # part1 rule 16: the served space, with coverage of current segments.
    spaces = api.get(f"/v0/corpora/{corpus}/vector-spaces").json()["items"]
    assert [(s["name"], s["owner"], s["dimensions"], s["metric"], s["role"]) for s in spaces] == [
        ("minilm_l6_v2", "engine", 384, "cosine", "served")]
    assert spaces[0]["coverage"] == 3

    # A replay builds a new vector generation from the stored vectors and cuts over.
    env = dict(os.environ, CONTENTSVC_DATABASE_URL=server.database_url, CONTENTSVC_HOME=str(server.home))
    out = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "replay", "vectors"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert semantic_top(api, corpus, "immunization of kids")["record_id"] == records["vaccine"]

    # A withdrawn Record leaves semantic results too.
    api.post("/v0/records/withdrawals", json={"idempotency_key": "w-vaccine", "source": {
        "corpus_id": corpus, "namespace": "test", "record_key": "vaccine"}})
    deadline = time.time() + 30
    while time.time() < deadline:
        r = api.post("/v0/search", json={"query": "immunization of kids", "corpus_ids": [corpus],
                                         "mode": "semantic"}).json()
        if all(h["record_id"] != records["vaccine"] for h in r["items"]):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("a withdrawn Record is still cited")
