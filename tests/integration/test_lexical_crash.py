"""The lexical projector survives kill -9 (issue: crash test; projectors/lexical.py "Order of a step").

`serve` and the materializer, read-model and lexical projectors run as
separate processes on their own database and CONTENTSVC_HOME. Records are
ingested over HTTP while the lexical projector is killed with SIGKILL again
and again and restarted. Afterwards every Version is searchable, got exactly
one `retrieval_ready` availability event (at most one `building_baseline`),
and search answers what a clean `projector replay lexical` answers.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest
import tantivy

from contentsvc.operator import replay
from contentsvc.search.generations import Generation
from projectors.lexical import LexicalProjector
from tests.integration.stack import Stack, command, ingest_batch


@pytest.fixture(scope="module")
def stack(databases, tmp_path_factory):
    # New Corpora get no engine vector space: search is lexical in every mode (no vector projector here);
    # a rebuild takes many small steps, so that kills land inside it.
    s = Stack(databases.create(), tmp_path_factory.mktemp("lexcrash"), ("materializer", "readmodel", "lexical"),
              CONTENTSVC_ENGINE_VECTORS="0", CONTENTSVC_BACKFILL_CHUNK="10")
    yield s
    s.close()


def wait_all_searchable(url: str, receipts: list[str], timeout: float = 90.0) -> dict[str, tuple[str, str]]:
    """receipt_id -> (record_id, version_id), once every Receipt's Version is searchable."""
    deadline = time.time() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                "SELECT r.receipt_id, r.record_id, r.version_id FROM receipts r JOIN versions v"
                " ON v.version_id = r.version_id WHERE r.receipt_id = ANY(%s) AND v.searchable", (receipts,)
            ).fetchall()
            if len(rows) == len(receipts):
                return {row[0]: (row[1], row[2]) for row in rows}
            assert time.time() < deadline, f"{len(receipts) - len(rows)} Versions never became searchable"
            time.sleep(0.2)


def availability_counts(url: str, version_ids: list[str]) -> dict[str, dict[str, int]]:
    """version_id -> {state: how many record.availability_changed events the journal holds}."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT version_id, payload->>'state', count(*) FROM journal"
            " WHERE kind = 'record.availability_changed' AND version_id = ANY(%s) GROUP BY 1, 2",
            (version_ids,)).fetchall()
    out: dict[str, dict[str, int]] = {v: {} for v in version_ids}
    for version_id, state, count in rows:
        out[version_id][state] = count
    return out


def assert_published_once(url: str, version_ids: list[str]) -> None:
    counts = availability_counts(url, version_ids)
    twice = {v: c for v, c in counts.items() if c.get("retrieval_ready") != 1 or c.get("building_baseline", 0) > 1}
    assert twice == {}, list(twice.items())[:5]


def search(client: httpx.Client, query: str, corpus: str, limit: int = 10) -> list[tuple]:
    r = client.post("/v0/search", json={"query": query, "corpus_ids": [corpus], "limit": limit, "mode": "lexical"})
    assert r.status_code == 200, r.text
    return [(h["rank"], h["record_id"], h["version_id"], h["part_key"], h["excerpt"]["text"], h["excerpt"]["start"],
             h["excerpt"]["end"]) for h in r.json()["items"]]


def serving_generation(url: str) -> str:
    with psycopg.connect(url) as conn:
        [(generation,)] = conn.execute(
            "SELECT generation_id FROM search_generations WHERE kind = 'lexical' AND state = 'serving'").fetchall()
    return generation


def test_kill_minus_nine_publishes_once_and_matches_a_clean_replay(stack):
    # issue: crash test (kill -9 at any moment loses and duplicates nothing); projectors/lexical.py:
    # retrieval_ready only after the index commit, published once; decisions.md Search.
    client = stack.client
    assert client.post("/v0/corpora", json={"idempotency_key": "c", "corpus_id": "crash", "name": "c"}
                       ).status_code == 201
    run = uuid.uuid4().hex[:6]
    tokens = [f"lx{run}n{i:04d}" for i in range(600)]
    groups = [f"grp{run}g{g:02d}" for g in range(20)]  # 30 Records each
    stop = threading.Event()
    kills = [0]

    def killer():
        rnd = random.Random(7)
        opened = 0
        while not stop.is_set():
            # Kill only a process that is folding (it opened its generation), a moment later.
            while stack.log_count("lexical_generation_open") <= opened and not stop.wait(0.05):
                pass
            opened = stack.log_count("lexical_generation_open")
            if stop.wait(rnd.uniform(0.05, 0.5)):
                break
            stack.kill("lexical")
            kills[0] += 1
            stack.restart("lexical")

    thread = threading.Thread(target=killer)
    thread.start()
    receipts: list[str] = []
    try:
        for b in range(12):  # 600 Records, 50 a batch
            receipts += ingest_batch(client, [
                command("crash", f"r{i}", f"{tokens[i]} {groups[i % 20]} café 😀 text number {i}")
                for i in range(b * 50, b * 50 + 50)])
            time.sleep(0.6)
        deadline = time.time() + 30
        while kills[0] < 4:
            assert time.time() < deadline
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join()

    linked = wait_all_searchable(stack.url, receipts)
    versions = [linked[r][1] for r in receipts]
    # (a) every Version: exactly one retrieval_ready, at most one building_baseline.
    assert_published_once(stack.url, versions)

    # (b) each Record's own token finds exactly that Record, over HTTP.
    def check(i: int) -> None:
        with httpx.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {stack.secret}"},
                          timeout=30) as c:
            for j in range(i, 600, 4):
                hits = search(c, tokens[j], "crash")
                assert [(h[1], h[2]) for h in hits] == [linked[receipts[j]]], (tokens[j], hits)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(check, range(4)))

    # ... and search answers exactly what a clean replay from position 0 answers.
    queries = tokens[::37] + groups[:4]
    before = {q: search(client, q, "crash", limit=50) for q in queries}
    assert all(len(before[q]) == 30 for q in groups[:4])
    old = serving_generation(stack.url)
    stack.cli("projector", "replay", "lexical")
    assert serving_generation(stack.url) != old
    after = {q: search(client, q, "crash", limit=50) for q in queries}
    for q in tokens[::37]:
        assert after[q] == before[q], q
    for q in groups[:4]:  # near-equal scores: the order among them may differ, what is cited may not
        assert {h[1:] for h in after[q]} == {h[1:] for h in before[q]}, q
    assert_published_once(stack.url, versions)  # the replay publishes nothing again


def test_replay_while_the_projector_is_down_publishes_what_it_indexed(stack):
    # projectors/lexical.py and search/replay.py: a replay folds the journal to its head and cuts
    # over; Versions the serving generation had not reached yet must still get their
    # retrieval_ready (exactly once), else they are never searchable. decisions.md Search.
    client = stack.client
    assert client.post("/v0/corpora", json={"idempotency_key": "d", "corpus_id": "down", "name": "d"}
                       ).status_code == 201
    run = uuid.uuid4().hex[:6]
    first = ingest_batch(client, [command("down", f"a{i}", f"up{run}x{i:02d} before") for i in range(5)])
    wait_all_searchable(stack.url, first)

    stack.kill("lexical")  # down for a while: accepted Versions stay materialized
    try:
        gap = ingest_batch(client, [command("down", f"b{i}", f"gap{run}x{i:02d} during") for i in range(20)])
        with psycopg.connect(stack.url, autocommit=True) as conn:
            deadline = time.time() + 30
            while conn.execute("SELECT count(*) FROM receipts WHERE receipt_id = ANY(%s) AND state = 'resolved'",
                               (gap,)).fetchone()[0] < 20:
                assert time.time() < deadline
                time.sleep(0.1)
        stack.cli("projector", "replay", "lexical")
    finally:
        stack.restart("lexical")
    late = ingest_batch(client, [command("down", "c", f"late{run}x00 after")])

    linked = wait_all_searchable(stack.url, first + gap + late, timeout=30)
    assert_published_once(stack.url, [linked[r][1] for r in first + gap + late])
    for i, receipt in enumerate(gap):
        assert [(h[1], h[2]) for h in search(client, f"gap{run}x{i:02d}", "down")] == [linked[receipt]]
    assert [(h[1], h[2]) for h in search(client, f"late{run}x00", "down")] == [linked[late[0]]]


def test_kill_minus_nine_during_a_rebuild_activates_it_once_with_the_same_hits(stack):
    # part 1 rule 17 (retries keep identity and target generation); projectors/projections.py:
    # a backfill chunk commits the index before its cursor, so a crash redoes it, idempotently.
    client = stack.client
    assert client.post("/v0/corpora", json={"idempotency_key": "c2", "corpus_id": "rebuilt", "name": "r"}
                       ).status_code == 201
    run = uuid.uuid4().hex[:6]
    tokens = [f"rb{run}n{i:04d}" for i in range(400)]
    groups = [f"grp{run}g{g:02d}" for g in range(20)]  # 20 Records each
    receipts: list[str] = []
    for b in range(4):
        receipts += ingest_batch(client, [command("rebuilt", f"r{i}", f"{tokens[i]} {groups[i % 20]} words {i}")
                                          for i in range(b * 100, b * 100 + 100)])
    wait_all_searchable(stack.url, receipts)
    queries = tokens[::23] + groups[:3]
    before = {q: search(client, q, "rebuilt", limit=50) for q in queries}

    r = client.post("/v0/corpora/rebuilt/rebuilds", json={"idempotency_key": "rebuild"})
    assert r.status_code == 202, r.text
    operation_id = r.json()["operation_id"]
    kills, rnd = 0, random.Random(11)
    while client.get(f"/v0/operations/{operation_id}").json()["state"] in ("queued", "running"):
        opened = stack.log_count("lexical_generation_open")
        time.sleep(rnd.uniform(0.1, 0.4))
        if client.get(f"/v0/operations/{operation_id}").json()["state"] not in ("queued", "running"):
            break
        stack.kill("lexical")
        kills += 1
        stack.restart("lexical")
        deadline = time.time() + 30
        while stack.log_count("lexical_generation_open") <= opened:  # wait until the new process is folding again
            assert time.time() < deadline
            time.sleep(0.05)
    assert kills >= 1
    op = client.get(f"/v0/operations/{operation_id}").json()
    assert op["state"] == "succeeded", op
    assert op["counters"] == {"versions_in_scope": 400, "versions_done": 400}
    corpus = client.get("/v0/corpora/rebuilt").json()
    assert corpus["projection_generation_id"] == op["result"]["projection_generation_id"]
    with psycopg.connect(stack.url) as conn:
        outcomes = conn.execute(
            "SELECT kind, payload->'operation'->>'state', count(*) FROM journal WHERE corpus_id = 'rebuilt'"
            " AND kind IN ('operation.changed', 'corpus.retrieval_changed') GROUP BY 1, 2").fetchall()
    counted = {(kind, state): n for kind, state, n in outcomes}
    assert counted[("operation.changed", "succeeded")] == 1 and counted[("corpus.retrieval_changed", None)] == 1
    after = {q: search(client, q, "rebuilt", limit=50) for q in queries}
    for q in tokens[::23]:
        assert after[q] == before[q], q
    for q in groups[:3]:  # near-equal scores: the order among them may differ, what is cited may not
        assert len(after[q]) == 20 and {h[1:] for h in after[q]} == {h[1:] for h in before[q]}, q


def test_a_replay_read_in_many_batches_indexes_every_version_once(stack, monkeypatch):
    # operator/replay.py: the next batch is read while this one is indexed. With batches of 7
    # events, 40 Records take six; the new generation answers what the serving one answered.
    client = stack.client
    assert client.post("/v0/corpora", json={"idempotency_key": "m", "corpus_id": "batches", "name": "m"}
                       ).status_code == 201
    run = uuid.uuid4().hex[:6]
    receipts = ingest_batch(client, [command("batches", f"r{i}", f"bt{run}n{i:02d} shared{run} words")
                                     for i in range(40)])
    linked = wait_all_searchable(stack.url, receipts)
    shared = {(h[1], h[2]) for h in search(client, f"shared{run}", "batches", limit=50)}
    assert len(shared) == 40  # all of them: under the limit, near-equal scores cannot reorder the set

    monkeypatch.setattr(replay, "BATCH", 7)
    old = serving_generation(stack.url)
    asyncio.run(replay.replay_lexical(stack.url, stack.home))
    assert serving_generation(stack.url) != old

    for i, receipt in enumerate(receipts):
        assert [(h[1], h[2]) for h in search(client, f"bt{run}n{i:02d}", "batches")] == [linked[receipt]]
    assert {(h[1], h[2]) for h in search(client, f"shared{run}", "batches", limit=50)} == shared
    assert_published_once(stack.url, [linked[r][1] for r in receipts])



def test_reopening_a_generation_whose_files_vanished_replaces_its_writer_whatever_state_it_is_in(databases, tmp_path):
    # projectors/faults.py: a failing step is retried with the fold reopened, the process staying up.
    # When a generation's files vanish under its writer, Tantivy either fails the commit or kills the
    # writer (an io error in its indexing thread; which one is a race, about even here). A killed
    # writer raises at every close: reopening closed it first, so it failed at every retry of the
    # fault, the generation was never refolded and its Corpora answered 503 for good (a restart used
    # to do the refold). part1 "What the service does": 503 while lost, then the refolded index.
    projector = LexicalProjector(tmp_path)
    generation = Generation(generation_id="gen_vanishing", kind="lexical", state="serving", announced=0)
    outcomes = []

    async def rounds() -> None:
        async with await psycopg.AsyncConnection.connect(databases.create()) as conn:
            for _ in range(40):  # until both outcomes were met (each about even, so a few rounds)
                assert await projector.open_generation(conn, generation, 7) == 0  # the index starts empty
                projector.writer.commit(7)
                assert projector.writer.checkpoint() == 7
                shutil.rmtree(generation.path(tmp_path))
                try:
                    for n in range(200):  # a batch of Versions being indexed
                        projector.writer.writer.add_document(tantivy.Document(doc_id=f"d{n}", position=n))
                    projector.writer.commit(8)
                except ValueError as exc:
                    outcomes.append("killed" if "killed" in str(exc) else "failed")
                if {"killed", "failed"} <= set(outcomes):
                    break
            assert await projector.open_generation(conn, generation, 8) == 0

    asyncio.run(rounds())
    assert {"killed", "failed"} <= set(outcomes), outcomes
