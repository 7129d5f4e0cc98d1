"""The lexical fold behind the journal: several batches to one index commit, each published alone.

projectors/lexical.py ("Order of a step"; docs/decisions.md "The lexical fold's index commits"):
a backlog is read a batch (500 positions) at a time; the batches after the first join its index
commit, because a commit's fixed cost outweighs the indexing of a batch of small Versions. Each
batch's `retrieval_ready` events are still appended in a transaction of their own, so the
journal lock is held no longer than for one batch. Part 1, "States and transitions": every
Version still becomes current once, and only after the commit holding it.
"""

from __future__ import annotations

import psycopg
import pytest
import tantivy

from tests.conftest import until
from tests.integration.stack import Stack, command, ingest_batch

RECORDS = 500  # about 2,000 positions with the lexical fold down: four or five batches of 500


@pytest.fixture
def stack(databases, tmp_path):
    s = Stack(databases.create(), tmp_path, ("materializer", "readmodel", "lexical"), CONTENTSVC_ENGINE_VECTORS="0")
    yield s
    s.close()


def batches_holding(positions: list[int], size: int = 500) -> int:
    """The fewest batches of `size` positions that can hold these (sorted) positions: a batch
    starting after position q holds q+1..q+size. Where the materializer appended several ingest
    batches' Versions in one step, they sit in fewer batches than the backlog spans."""
    count, end = 0, None
    for p in positions:
        if end is None or p > end:
            count, end = count + 1, p + size - 1
    return count


def test_a_backlog_is_one_index_commit_published_batch_by_batch(stack):
    assert stack.client.post("/v0/corpora", json={"idempotency_key": "c", "corpus_id": "backlog", "name": "b"}
                             ).status_code == 201
    until(lambda: stack.log_count("lexical_generation_open") >= 1, "the lexical fold opening its index")
    stack.kill("lexical")
    receipts: list[str] = []
    for b in range(0, RECORDS, 100):
        receipts += ingest_batch(stack.client, [command("backlog", f"r{i}", f"backlog word{i} text")
                                                for i in range(b, b + 100)])
    with psycopg.connect(stack.url, autocommit=True) as conn:
        def versions(condition: str) -> bool:  # every Version of the backlog, under `condition`
            return conn.execute("SELECT count(*) FROM versions v JOIN receipts r ON r.version_id = v.version_id"
                                f" WHERE r.receipt_id = ANY(%s) AND {condition}", (receipts,)).fetchone()[0] == RECORDS

        until(lambda: versions("true"), "the materializer accepting every Version", timeout=60)
        start, backlog_head = conn.execute(
            "SELECT (SELECT position FROM projector_checkpoints WHERE name LIKE 'lexical:%%'),"
            " (SELECT max(position) FROM journal)").fetchone()

        stack.restart("lexical")
        until(lambda: versions("v.searchable"), "every Version searchable", timeout=60)
        # The transactions that appended the backlog's retrieval_ready events (xmin: the writer's).
        ready = conn.execute(
            "SELECT count(*), count(DISTINCT xmin::text) FROM journal WHERE kind = 'record.availability_changed'"
            " AND payload->>'state' = 'retrieval_ready' AND payload->>'is_current' = 'true'"
            " AND position > %s", (backlog_head,)).fetchone()
        [(generation,)] = conn.execute("SELECT generation_id FROM search_generations"
                                       " WHERE kind = 'lexical' AND state = 'serving'").fetchall()
        [(record_id,)] = conn.execute("SELECT record_id FROM receipts WHERE receipt_id = %s",
                                      (receipts[437],)).fetchall()
        accepted = [p for (p,) in conn.execute("SELECT position FROM journal WHERE kind = 'record.accepted'"
                                               " AND position > %s ORDER BY position", (start,))]

    batches = -(-(backlog_head - start) // 500)
    assert batches >= 3, (start, backlog_head)  # the backlog spans several batches
    assert ready[0] == RECORDS  # each Version made current once
    assert ready[1] >= batches_holding(accepted), (ready, batches)  # published batch by batch
    searcher = tantivy.Index.open(str(stack.home / "indexes" / "lexical" / generation)).searcher()
    assert searcher.num_docs == RECORDS + 1  # and the checkpoint document
    # A commit makes a segment: one per batch before (fewer than 8, so none merged yet), one for
    # the whole backlog now (two if a loaded machine took more than GATHER_SECONDS to gather it).
    assert searcher.num_segments <= batches // 2, (searcher.num_segments, batches)
    hits = stack.client.post("/v0/search", json={"query": "word437", "corpus_ids": ["backlog"], "mode": "lexical"})
    assert [h["record_id"] for h in hits.json()["items"]] == [record_id]
