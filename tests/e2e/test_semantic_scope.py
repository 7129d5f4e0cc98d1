"""Semantic search in its scope: filtered before ranking, the space's query limit, coverage.

Part 1 rule 20: searchRecords compiles the mandatory Organization and Corpus prefilters
plus the requested filter before it obtains candidates; `query_too_long` is over the
profile's or the vector space owner's limit and the message names it; semantic-only
queries require vector coverage.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import hnswlib
import numpy as np
import psycopg

from contentsvc.search import vector_index
from contentsvc.search.embedding import DIMENSIONS
from tests.conftest import assert_error, client_for, create_corpus, key_for, text_command
from tests.e2e.test_semantic import wait_enriched

QUERY = "immunization of kids"
# The small Corpus: what a search for QUERY must find, by namespace, and what it need not.
RELEVANT = {
    "clinic": {
        "measles": "Vaccines prevent measles infection in children.",
        "schedule": "The pediatric vaccination schedule protects toddlers against polio and diphtheria.",
        "boosters": "Booster shots keep young children immune to whooping cough.",
    },
    "school": {
        "enrolment": "Schools ask parents for proof that their kids were vaccinated before enrolment.",
        "nurse": "The school nurse gives flu vaccines to pupils every autumn.",
    },
}
UNRELATED = {"markets": "Stock markets fell sharply on inflation fears.",
             "bread": "Knead the rye dough and let it rise overnight before baking."}
SYNTHETIC_PER_CORPUS = 2600  # two large Corpora: more than 5,000 vectors beside the small one


def ingest(api, corpus: str, namespace: str, key: str, text: str) -> str:
    cmd = text_command(corpus, key, text)
    cmd["source"]["namespace"] = namespace
    r = api.post("/v0/records", json=cmd)
    assert r.status_code == 202, r.text
    return r.json()["receipt_id"]


def record_ids(api, receipts: dict[str, str]) -> dict[str, str]:
    return {k: api.get(f"/v0/ingestion-receipts/{rid}").json()["record_id"] for k, rid in receipts.items()}


def crowd(url: str, corpus_id: str, count: int) -> None:
    """Stores `count` vectors next to the query's own in a large Corpus, as the vectors projector
    stores them (rows of the `vectors` table): more segments of its one embedded Version, whose
    text is the query itself. Embedding that many texts would take minutes."""
    rng = np.random.default_rng(11)
    with psycopg.connect(url) as conn:
        [(space, version_id, part_key, org_id, record_id, raw)] = conn.execute(
            "SELECT space, version_id, part_key, org_id, record_id, vector FROM vectors WHERE corpus_id = %s",
            (corpus_id,)).fetchall()
        base = vector_index.from_bytes(raw)
        noisy = base + rng.normal(scale=0.01, size=(count, DIMENSIONS)).astype(np.float32)
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        with conn.cursor().copy("COPY vectors (space, version_id, part_key, segment_start, org_id, corpus_id,"
                                " record_id, vector) FROM STDIN") as copy:
            for i, vector in enumerate(noisy, start=1):
                copy.write_row((space, version_id, part_key, i, org_id, corpus_id, record_id,
                                vector_index.to_bytes(vector)))


def replay_vectors(server) -> str:
    """`contentsvc projector replay vectors`: a new generation from the stored vectors, cut over."""
    env = dict(os.environ, CONTENTSVC_DATABASE_URL=server.database_url, CONTENTSVC_HOME=str(server.home))
    out = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "replay", "vectors"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with psycopg.connect(server.database_url) as conn:
        [(generation,)] = conn.execute("SELECT generation_id FROM search_generations"
                                       " WHERE kind = 'vectors' AND state = 'serving'").fetchall()
    return generation


def served_vectors(server, generation: str) -> int:
    directory = server.home / "indexes" / "vectors" / generation
    snapshot = vector_index.read_snapshot(directory)
    index = hnswlib.Index(space="cosine", dim=DIMENSIONS)
    index.load_index(str(directory / snapshot.file), max_elements=0)
    return index.get_current_count()


def search(api, corpus_ids: list[str], mode: str = "semantic", limit: int = 10, **extra) -> list[dict]:
    r = api.post("/v0/search", json={"query": QUERY, "corpus_ids": corpus_ids, "mode": mode, "limit": limit,
                                     **extra})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def found_once_served(api, corpus_ids: list[str], expected: set[str], **extra) -> list[dict]:
    """The search's hits once the API serves the replayed generation (it loads the serving
    generation's snapshot per search; bounded wait)."""
    for _ in range(100):
        items = search(api, corpus_ids, **extra)
        if expected <= {h["record_id"] for h in items}:
            return items
        time.sleep(0.2)
    return items


def test_a_small_corpus_beside_thousands_of_closer_vectors_finds_every_relevant_document(replay_server):
    # Not the shared server: the vector replay below cuts over every Corpus of the deployment.
    url = replay_server.database_url
    with client_for(replay_server, key_for(url, "org-small")) as api, \
            client_for(replay_server, key_for(url, "org-other")) as other:
        _filtered_before_ranking(replay_server, api, other)


def _filtered_before_ranking(server, api, other):
    small, large, foreign = create_corpus(api), create_corpus(api), create_corpus(other)
    receipts = {key: ingest(api, small, ns, key, text) for ns, texts in RELEVANT.items() for key, text in texts.items()}
    receipts |= {key: ingest(api, small, "clinic", key, text) for key, text in UNRELATED.items()}
    # Each large Corpus holds one Record whose text is the query itself, in the small Corpus's namespaces.
    crowd_receipts = [ingest(api, large, "clinic", "echo", QUERY), ingest(other, foreign, "school", "echo", QUERY)]
    wait_enriched(api, list(receipts.values()) + crowd_receipts[:1])
    wait_enriched(other, crowd_receipts[1:])
    records = record_ids(api, receipts)
    relevant = {ns: {records[k] for k in texts} for ns, texts in RELEVANT.items()}
    every_relevant = relevant["clinic"] | relevant["school"]

    crowd(server.database_url, large, SYNTHETIC_PER_CORPUS)
    crowd(server.database_url, foreign, SYNTHETIC_PER_CORPUS)
    generation = replay_vectors(server)
    # The served index holds them all, each nearer the query than anything in the small Corpus.
    assert served_vectors(server, generation) >= 2 * SYNTHETIC_PER_CORPUS + len(records)

    # part1 rule 20: the Corpus prefilter applies before the top-k is taken: every relevant
    # document of the small Corpus, ranked above the unrelated ones.
    items = found_once_served(api, [small], every_relevant)
    ranked = [h["record_id"] for h in items]
    assert set(ranked[:len(every_relevant)]) == every_relevant, items
    assert set(ranked) == set(records.values())
    assert [h["explanation"]["semantic_rank"] for h in items] == list(range(1, len(items) + 1))

    # part1 rule 20 and "Agent tool server" (`source_namespaces`: the best matches of those
    # sources even when others rank higher): a namespace filter over the small and the large
    # Corpus, whose thousands of vectors of namespace `clinic` rank higher.
    echo = api.get(f"/v0/ingestion-receipts/{crowd_receipts[0]}").json()["record_id"]
    in_namespace = {"school": relevant["school"],
                    "clinic": relevant["clinic"] | {records[k] for k in UNRELATED} | {echo}}
    for namespace, expected in in_namespace.items():
        items = found_once_served(api, [large, small], expected, filter={"source_namespaces": [namespace]})
        assert {h["record_id"] for h in items} == expected, (namespace, items)

    # Hybrid ranks the same filtered semantic candidates (no query word occurs in them).
    items = found_once_served(api, [small], every_relevant, mode="hybrid")
    assert every_relevant <= {h["record_id"] for h in items if h["explanation"].get("semantic_rank")}, items

    # The other Organization's Corpus is out of scope whatever its vectors (404 for this key),
    # and its own search finds its one Record.
    r = api.post("/v0/search", json={"query": QUERY, "corpus_ids": [foreign], "mode": "semantic"})
    assert r.status_code == 404, r.text
    assert len(search(other, [foreign])) == 1


def test_a_query_longer_than_the_spaces_token_window_is_refused_naming_it(api):
    # part1 rule 20: 422 `query_too_long` over the profile's or the vector space owner's limit;
    # the message names it. MiniLM reads 256 tokens; this query is far fewer than 8192 characters.
    corpus = create_corpus(api)
    wait_enriched(api, [ingest(api, corpus, "clinic", "measles", RELEVANT["clinic"]["measles"])])
    long_query = " ".join(["vaccines"] * 300)  # 302 tokens with [CLS] and [SEP]
    assert len(long_query) < 8192
    for mode in ("semantic", "hybrid"):
        r = api.post("/v0/search", json={"query": long_query, "corpus_ids": [corpus], "mode": mode})
        body = assert_error(r, 422, "query_too_long")
        assert body["field"] == "/query"
        assert "minilm_l6_v2" in body["message"] and "256 tokens" in body["message"], body
    # Lexical search is not bound by the model's window.
    r = api.post("/v0/search", json={"query": long_query, "corpus_ids": [corpus], "mode": "lexical"})
    assert r.status_code == 200 and len(r.json()["items"]) == 1, r.text
    # Within the window, semantic search answers.
    r = api.post("/v0/search", json={"query": " ".join(["vaccines"] * 254), "corpus_ids": [corpus],
                                     "mode": "semantic"})
    assert r.status_code == 200, r.text
    # The profile's own limit is named as the profile's.
    r = api.post("/v0/search", json={"query": "q" * 8193, "corpus_ids": [corpus], "mode": "lexical"})
    body = assert_error(r, 422, "query_too_long")
    assert "'default'" in body["message"] and "8192 characters" in body["message"], body


def test_semantic_only_search_without_vector_coverage_is_an_error_never_empty(api):
    # part1 rule 20: semantic-only queries require vector coverage (422 `unsupported_search`);
    # the Corpus has the space (listVectorSpaces, rule 16) but no current segment holds a vector.
    empty, covered = create_corpus(api), create_corpus(api)
    wait_enriched(api, [ingest(api, covered, "clinic", "measles", RELEVANT["clinic"]["measles"])])
    [space] = api.get(f"/v0/corpora/{empty}/vector-spaces").json()["items"]
    assert space["coverage"] == 0
    for corpus_ids in ([empty], [covered, empty]):
        r = api.post("/v0/search", json={"query": QUERY, "corpus_ids": corpus_ids, "mode": "semantic"})
        body = assert_error(r, 422, "unsupported_search")
        assert empty in body["message"] and "coverage" in body["message"], body
    assert len(search(api, [covered])) == 1
    # Hybrid needs no coverage: an uncovered Corpus ranks lexically (decisions.md, Search).
    r = api.post("/v0/search", json={"query": QUERY, "corpus_ids": [empty], "mode": "hybrid"})
    assert r.status_code == 200 and r.json()["items"] == [], r.text

    # A Corpus whose only embedded Record was withdrawn covers nothing any more.
    api.post("/v0/records/withdrawals", json={"idempotency_key": "w-measles", "source": {
        "corpus_id": covered, "namespace": "clinic", "record_key": "measles"}})
    for _ in range(150):
        r = api.post("/v0/search", json={"query": QUERY, "corpus_ids": [covered], "mode": "semantic"})
        if r.status_code != 200:
            break
        time.sleep(0.2)
    assert_error(r, 422, "unsupported_search")


def test_a_scope_is_read_again_once_the_read_model_moves(api):
    # part1 rule 20 (only current, searchable Versions rank) and search/semantic_scopes.py: the
    # labels of a scope are reused only while the read model's position is the one they were read
    # at, so the search right after a Receipt shows enrichment ranks the new vectors.
    corpus = create_corpus(api)

    def version(receipt_id: str) -> tuple[str, str]:
        receipt = api.get(f"/v0/ingestion-receipts/{receipt_id}").json()
        return receipt["record_id"], receipt["version_id"]

    def ranked() -> set[tuple[str, str]]:
        return {(h["record_id"], h["version_id"]) for h in search(api, [corpus])}

    first = ingest(api, corpus, "clinic", "measles", RELEVANT["clinic"]["measles"])
    wait_enriched(api, [first])
    assert ranked() == {version(first)}
    assert ranked() == {version(first)}  # again at the same position: the same answer
    second = ingest(api, corpus, "clinic", "boosters", RELEVANT["clinic"]["boosters"])
    wait_enriched(api, [second])
    assert ranked() == {version(first), version(second)}
    # The first Record's new Version replaces its vectors in the scope.
    replaced = ingest(api, corpus, "clinic", "measles", UNRELATED["bread"])
    wait_enriched(api, [replaced])
    assert ranked() == {version(replaced), version(second)}
