"""A rebuild adds the vector spaces enabled since a Corpus was built (part 1 rule 16).

A Corpus created while the engine's vector space is off lists no space and
refuses semantic search; after the operator enables the space and restarts,
the Corpus still lists only what it was built with, until a rebuild: then it
lists the space, its existing Versions are embedded (coverage grows to all of
them) and semantic search finds them.
"""

from __future__ import annotations

import time

import psycopg

from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, key_for, text_command
from tests.e2e.test_search import ingest, wait_searchable
from tests.e2e.test_semantic import TEXTS, semantic_top


def test_a_rebuild_adds_the_engine_space_and_embeds_existing_versions(databases, tmp_path):
    url = databases.create()
    secret = key_for(url, "spaces")
    without = ServerProcess(url, tmp_path, extra_env={"CONTENTSVC_ENGINE_VECTORS": "0"})
    try:
        with client_for(without, secret) as api:
            corpus = create_corpus(api)
            assert api.get(f"/v0/corpora/{corpus}").json()["vector_spaces"] == []
            receipts = {name: ingest(api, text_command(corpus, name, text)) for name, text in TEXTS.items()}
            records = {name: wait_searchable(api, r)["record_id"] for name, r in receipts.items()}
    finally:
        without.stop()

    with_space = ServerProcess(url, tmp_path, home=without.home)  # the space is on by default
    try:
        with client_for(with_space, secret) as api:
            # Built before the space was enabled: it lists only what it was built with.
            assert api.get(f"/v0/corpora/{corpus}/vector-spaces").json()["items"] == []
            r = api.post("/v0/search", json={"query": "children's vaccination", "corpus_ids": [corpus],
                                             "mode": "semantic"})
            assert_error(r, 422, "unsupported_search")

            op = api.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": "add-space"}).json()
            deadline = time.time() + 60
            while (op := api.get(f"/v0/operations/{op['operation_id']}").json())["state"] not in (
                    "succeeded", "failed", "canceled"):
                assert time.time() < deadline
                time.sleep(0.1)
            assert op["state"] == "succeeded", op
            assert api.get(f"/v0/corpora/{corpus}").json()["vector_spaces"] == ["minilm_l6_v2"]

            # The existing Versions are embedded: coverage reaches every current segment.
            deadline = time.time() + 120
            while True:
                [space] = api.get(f"/v0/corpora/{corpus}/vector-spaces").json()["items"]
                if space["coverage"] == len(TEXTS):
                    break
                assert time.time() < deadline, space
                time.sleep(0.2)
            hit = semantic_top(api, corpus, "immunization protects kids from disease", expect=len(TEXTS))
            assert hit["record_id"] == records["vaccine"]
            # Each Version was embedded once: one record.enriched each.
            with psycopg.connect(url) as conn:
                counts = conn.execute("SELECT version_id, count(*) FROM journal WHERE kind = 'record.enriched'"
                                      " AND corpus_id = %s GROUP BY 1", (corpus,)).fetchall()
            assert len(counts) == len(TEXTS) and {n for _, n in counts} == {1}
    finally:
        with_space.stop()
