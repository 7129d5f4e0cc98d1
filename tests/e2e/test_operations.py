"""Retrieval configuration, rebuilds and the Operations API over HTTP, on a server of
this module's own (its lexical projector is paused with SIGSTOP to hold Operations
in flight deterministically, and its backfill works in small chunks so that
progress is observable).

part 1: rules 9 to 12 (Operations), 15 (configureRetrieval), 17
(rebuildCorpusProjection), the Operation and Retrieval configuration sections and
the state table; decisions.md Operations.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager

import httpx
import psycopg
import pytest
import tantivy

from contentsvc.domain.operations import projection_generation_for
from contentsvc.search import lexical_index
from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, key_for, suspend_caught_up, until
from tests.e2e.test_search import _token, assert_excerpt_exact, ingest, ingest_batch, search, wait_searchable

CHUNK = 40


@pytest.fixture(scope="module")
def own_server(databases, tmp_path_factory):
    """Its own database too: the lexical generations a server serves live under its own home."""
    proc = ServerProcess(databases.create(), tmp_path_factory.mktemp("operations"),
                         extra_env={"CONTENTSVC_BACKFILL_CHUNK": str(CHUNK), "CONTENTSVC_RETIRED_GRACE_SECONDS": "1"})
    yield proc
    proc.stop()


def new_key(server: ServerProcess) -> str:
    """A key for a fresh Organization of the server's database."""
    return key_for(server.database_url, f"org_{uuid.uuid4().hex[:10]}")


@pytest.fixture()
def client(own_server):
    with client_for(own_server, new_key(own_server)) as c:
        yield c


@contextmanager
def lexical_projector_paused(server: ServerProcess):
    """SIGSTOP the server's lexical projector: accepted Operations stay queued until it resumes."""
    process = suspend_caught_up(server, "lexical")
    try:
        yield
    finally:
        process.resume()


def feed_cursor(client: httpx.Client, corpus: str) -> str:
    """A change-feed cursor at the head: events from now on."""
    return client.get("/v0/changes", params={"corpus_id": corpus}).json()["next_cursor"]


def feed_since(client: httpx.Client, corpus: str, cursor: str) -> list[dict]:
    items: list[dict] = []
    while True:
        page = client.get("/v0/changes", params={"corpus_id": corpus, "cursor": cursor, "limit": 1000}).json()
        if not page["items"]:
            return items
        items += page["items"]
        cursor = page["next_cursor"]


def documents_of(server: ServerProcess, projection_generation_id: str) -> int:
    """How many documents of a Corpus projection generation the serving index files hold."""
    with psycopg.connect(server.database_url) as conn:
        [(index_generation,)] = conn.execute(
            "SELECT generation_id FROM search_generations WHERE kind = 'lexical' AND state = 'serving'").fetchall()
    index, _ = lexical_index.open_index(server.home / "indexes" / "lexical" / index_generation)
    query = tantivy.Query.term_query(lexical_index.SCHEMA, "projection", projection_generation_id)
    return index.searcher().search(query, 1, count=True).count


def wait_purged(server: ServerProcess, projection_generation_id: str, timeout: float = 20.0) -> None:
    deadline = time.time() + timeout
    while documents_of(server, projection_generation_id) > 0:
        assert time.time() < deadline, f"documents of {projection_generation_id} were never deleted"
        time.sleep(0.2)


def key() -> str:
    return uuid.uuid4().hex


def wait_terminal(client: httpx.Client, operation_id: str, timeout: float = 60.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = client.get(f"/v0/operations/{operation_id}")
        assert r.status_code == 200, r.text
        op = r.json()
        if op["state"] in ("succeeded", "failed", "canceled"):
            return op
        time.sleep(0.05)
    raise AssertionError(f"operation never finished: {op}")


def assert_operation_shape(op: dict) -> None:
    # part 1 "Operation": required members; decisions.md: rebuilds and configuration changes
    # always carry versions_in_scope and versions_done.
    assert {"operation_id", "kind", "state", "counters", "errors"} <= set(op), op
    assert op["kind"] in ("projection_rebuild", "retrieval_configuration")
    assert {"versions_in_scope", "versions_done"} <= set(op["counters"])
    assert all(isinstance(v, int) and v >= 0 for v in op["counters"].values())
    assert "corpus_id" in op
    if "progress" in op:
        assert 0 <= op["progress"] <= 1
    if op["state"] == "succeeded":
        assert set(op["result"]) == {"projection_generation_id"}
    # What the pending configuration is, is never reported (rule 15).
    assert "retrieval" not in op


def extension_command(corpus: str, record_key: str, text: str, **data) -> dict:
    return {"idempotency_key": key(), "source": {"corpus_id": corpus, "namespace": "test", "record_key": record_key},
            "content": {"kind": "text", "text": text}, "title": f"Headline {record_key}",
            "extensions": {"example": {"schema_version": "1", "data": data}}}


SUMMARY_FIELD = {"name": "summary", "source_pointer": "/extensions/example/data/summary", "type": "string",
                 "roles": ["search"]}


def configure(client: httpx.Client, corpus: str, fields: list[dict], idempotency_key: str | None = None,
              profile: str = "default") -> httpx.Response:
    return client.put(f"/v0/corpora/{corpus}/retrieval", json={
        "idempotency_key": idempotency_key or key(), "retrieval": {"plugin_profile": profile, "fields": fields}})


def test_configure_retrieval_indexes_a_mapped_field_after_a_validated_cutover(client):
    # part 1 rule 15 and "Retrieval configuration": other search fields add text once per Version.
    corpus = create_corpus(client)
    before = client.get(f"/v0/corpora/{corpus}").json()
    cursor = feed_cursor(client, corpus)
    word = _token("zebra")
    receipt = ingest(client, extension_command(corpus, "r1", "Plain body words only.", summary=f"about {word}"))
    record_id = wait_searchable(client, receipt)["record_id"]
    assert search(client, word, [corpus])["items"] == []  # not mapped yet: unmapped data is preserved, not searched

    # A searcher runs through the reconfiguration: the body is searched by both configurations,
    # so it finds the Record under the old one or the new one, never neither.
    counts: list[int] = []
    stop = threading.Event()

    def searcher():
        while not stop.is_set():
            counts.append(len(search(client, "plain body", [corpus])["items"]))

    thread = threading.Thread(target=searcher)
    thread.start()
    r = configure(client, corpus, [SUMMARY_FIELD], idempotency_key="config-1")
    assert r.status_code == 202, r.text
    op = r.json()
    assert_operation_shape(op)
    assert op["kind"] == "retrieval_configuration" and op["corpus_id"] == corpus
    assert r.headers["location"] == f"/v0/operations/{op['operation_id']}"

    # The old configuration stays effective until the cutover: a Corpus showing the new one
    # always comes with a succeeded Operation.
    while True:
        corpus_now = client.get(f"/v0/corpora/{corpus}").json()
        state = client.get(f"/v0/operations/{op['operation_id']}").json()["state"]
        if "summary" in [f["name"] for f in corpus_now["retrieval"]["fields"]]:
            break
        assert corpus_now["projection_generation_id"] == before["projection_generation_id"]
        assert state != "failed"
        time.sleep(0.02)
    done = wait_terminal(client, op["operation_id"])
    time.sleep(0.2)
    stop.set()
    thread.join()
    assert counts and set(counts) == {1}, counts
    assert_operation_shape(done)
    assert done["state"] == "succeeded", done
    assert done["counters"]["versions_in_scope"] == done["counters"]["versions_done"] == 1
    corpus_now = client.get(f"/v0/corpora/{corpus}").json()
    assert corpus_now["projection_generation_id"] == done["result"]["projection_generation_id"]
    assert corpus_now["projection_generation_id"] != before["projection_generation_id"]
    # getCorpus returns the effective resolved fields: the defaults plus the explicit one.
    assert [f["name"] for f in corpus_now["retrieval"]["fields"]] == ["title", "body", "summary"]

    [hit] = search(client, word, [corpus])["items"]
    assert hit["record_id"] == record_id
    assert_excerpt_exact(client, hit)
    assert len(search(client, "plain body", [corpus])["items"]) == 1  # the body is still searched
    # A Version ingested after the cutover is indexed with the new configuration at once.
    later = _token("yak")
    wait_searchable(client, ingest(client, extension_command(corpus, "r2", "Other words.", summary=later)))
    assert len(search(client, later, [corpus])["items"]) == 1

    # Same key and request replay the Operation; a changed request conflicts (rule 15).
    again = configure(client, corpus, [SUMMARY_FIELD], idempotency_key="config-1")
    assert again.status_code == 202 and again.json()["operation_id"] == op["operation_id"]
    assert_error(configure(client, corpus, [{**SUMMARY_FIELD, "type": "string_array"}], idempotency_key="config-1"),
                 409, "idempotency_conflict")

    # The change feed says so: the Corpus's retrieval changed, the Operation moved (ids only).
    kinds = [(e["kind"], e["subject"]["id"]) for e in feed_since(client, corpus, cursor)]
    assert ("corpus.retrieval_changed", corpus) in kinds
    assert ("operation.changed", op["operation_id"]) in kinds


def test_a_title_search_field_replaces_the_projected_title(client):
    # part 1 "Retrieval configuration": a search field named `title` replaces the projected title.
    corpus = create_corpus(client)
    headline, subject = _token("kestrel"), _token("osprey")
    cmd = extension_command(corpus, "t1", "Body text here.", subject=subject)
    cmd["title"] = f"Headline {headline}"
    wait_searchable(client, ingest(client, cmd))
    assert len(search(client, headline, [corpus])["items"]) == 1
    r = configure(client, corpus, [{"name": "title", "source_pointer": "/extensions/example/data/subject",
                                    "type": "string", "roles": ["search"]}])
    assert r.status_code == 202, r.text
    assert wait_terminal(client, r.json()["operation_id"])["state"] == "succeeded"
    assert len(search(client, subject, [corpus])["items"]) == 1
    assert search(client, headline, [corpus])["items"] == []


def test_configure_retrieval_refuses_invalid_configurations(client):
    # part 1 "Retrieval configuration" and FieldMapping rules; rule 15 errors.
    corpus = create_corpus(client)
    bad_root = {**SUMMARY_FIELD, "source_pointer": "/source/record_key"}
    e = assert_error(configure(client, corpus, [bad_root]), 422, "invalid_mapping")
    assert e["field"] == "/retrieval/fields/0/source_pointer"
    undeclared = {**SUMMARY_FIELD, "source_pointer": "/extensions/unknownns/data/x"}
    assert_error(configure(client, corpus, [undeclared]), 422, "invalid_mapping")
    assert_error(configure(client, corpus, [{**SUMMARY_FIELD, "type": "number"}]), 422, "invalid_mapping")
    assert_error(configure(client, corpus, [{**SUMMARY_FIELD, "name": "Bad-Name"}]), 422, "invalid_schema")
    assert_error(configure(client, corpus, [{**SUMMARY_FIELD, "roles": []}]), 422, "invalid_schema")
    assert_error(configure(client, corpus, [SUMMARY_FIELD], profile="nope"), 422, "unsupported_profile")
    assert_error(configure(client, "no-such-corpus", [SUMMARY_FIELD]), 404, "not_found")


def test_rebuild_cuts_over_while_searches_never_come_back_empty(own_server, client):
    # part 1 rule 17; issue: "a concurrent searcher sees old or new, never nothing".
    corpus = create_corpus(client)
    word = _token("heron")
    cursor = feed_cursor(client, corpus)
    n = 6 * CHUNK + 7
    commands = [extension_command(corpus, f"b{i}", f"{word} record number {i}") for i in range(n)]
    receipts = [r for i in range(0, n, 100) for r in ingest_batch(client, commands[i:i + 100])]
    for receipt in receipts[-5:]:
        wait_searchable(client, receipt)
    assert len(search(client, word, [corpus], limit=50)["items"]) == 50
    generation_before = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]

    counts: list[int] = []
    stop = threading.Event()

    def searcher():
        while not stop.is_set():
            counts.append(len(search(client, word, [corpus], limit=50)["items"]))

    thread = threading.Thread(target=searcher)
    thread.start()
    try:
        r = client.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": "rebuild-1"})
        assert r.status_code == 202, r.text
        op = r.json()
        assert_operation_shape(op)
        assert op["kind"] == "projection_rebuild" and r.headers["location"] == f"/v0/operations/{op['operation_id']}"
        seen_done = []
        while True:
            now = client.get(f"/v0/operations/{op['operation_id']}").json()
            seen_done.append(now["counters"]["versions_done"])
            if now["state"] in ("succeeded", "failed", "canceled"):
                break
            time.sleep(0.01)
        time.sleep(0.3)  # a few searches after the cutover too
    finally:
        stop.set()
        thread.join()
    assert now["state"] == "succeeded", now
    assert now["counters"] == {"versions_in_scope": n, "versions_done": n} and now["progress"] == 1
    assert seen_done == sorted(seen_done)  # progress only moves forward
    assert counts and min(counts) == 50, counts  # never a moment of empty (or partial) results
    generation_after = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]
    assert generation_after == now["result"]["projection_generation_id"] != generation_before
    # The new generation holds every Record; the retired one's documents go after the grace period.
    assert documents_of(own_server, generation_after) == n
    wait_purged(own_server, generation_before)

    # Progress was reported while the work ran: one operation.changed per chunk (ids only).
    moves = [e for e in feed_since(client, corpus, cursor) if e["kind"] == "operation.changed" and e["subject"]["id"] == op["operation_id"]]
    assert len(moves) >= n // CHUNK + 1, moves

    # Same key returns the same Operation, even after it finished (rule 17).
    again = client.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": "rebuild-1"})
    assert again.status_code == 202 and again.json()["operation_id"] == op["operation_id"]
    assert again.json()["state"] == "succeeded"


def test_cancel_rerun_and_resume(own_server, client):
    # part 1 rules 10, 11, 12 and the state table (cancel, rerun).
    corpus = create_corpus(client)
    receipt = ingest(client, extension_command(corpus, "c1", "Some text to rebuild."))
    wait_searchable(client, receipt)
    generation = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]

    with lexical_projector_paused(own_server):
        op = client.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": key()}).json()
        assert op["state"] == "queued"
        # Rerun is for terminal Operations only.
        assert_error(client.post(f"/v0/operations/{op['operation_id']}/rerun", json={"idempotency_key": key()}),
                     409, "operation_not_terminal")
        canceling = client.post(f"/v0/operations/{op['operation_id']}/cancel", json={"idempotency_key": key()})
        assert canceling.status_code == 200 and canceling.json()["state"] == "cancel_requested"
        # Idempotent: asking again changes nothing.
        assert client.post(f"/v0/operations/{op['operation_id']}/cancel").json()["state"] == "cancel_requested"
        # Resume returns non-backfill Operations unchanged (rule 12).
        resumed = client.post(f"/v0/operations/{op['operation_id']}/resume", json={"idempotency_key": key()})
        assert resumed.status_code == 200 and resumed.json()["state"] == "cancel_requested"
    canceled = wait_terminal(client, op["operation_id"])
    assert canceled["state"] == "canceled" and "result" not in canceled
    # No partial cutover: the Corpus still serves its old generation; the canceled one's documents go.
    assert client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"] == generation
    wait_purged(own_server, projection_generation_for(op["operation_id"]))
    assert documents_of(own_server, generation) == 1
    # Canceling a terminal Operation returns it unchanged (rule 10).
    assert client.post(f"/v0/operations/{canceled['operation_id']}/cancel").json()["state"] == "canceled"

    rerun_key = key()
    rerun = client.post(f"/v0/operations/{op['operation_id']}/rerun", json={"idempotency_key": rerun_key})
    assert rerun.status_code == 202, rerun.text
    new = rerun.json()
    assert new["operation_id"] != op["operation_id"] and new["previous_operation_id"] == op["operation_id"]
    assert new["kind"] == "projection_rebuild"
    replay = client.post(f"/v0/operations/{op['operation_id']}/rerun", json={"idempotency_key": rerun_key})
    assert replay.json()["operation_id"] == new["operation_id"]  # same key: same new Operation (rule 11)
    finished = wait_terminal(client, new["operation_id"])
    assert finished["state"] == "succeeded"
    assert client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"] == \
        finished["result"]["projection_generation_id"]


def test_a_newer_configuration_supersedes_a_pending_one(own_server, client):
    # part 1 rule 15 ("a newer accepted config supersedes older pending ones") and the state
    # table (retrieval_configuration_superseded; the effective configuration is not reverted).
    corpus = create_corpus(client)
    wait_searchable(client, ingest(client, extension_command(corpus, "s1", "Words.", summary="first", other="second")))
    with lexical_projector_paused(own_server):
        older = configure(client, corpus, [SUMMARY_FIELD]).json()
        newer = configure(client, corpus, [{**SUMMARY_FIELD, "source_pointer": "/extensions/example/data/other"}]).json()
    older_done, newer_done = wait_terminal(client, older["operation_id"]), wait_terminal(client, newer["operation_id"])
    assert older_done["state"] == "failed"
    assert [e["code"] for e in older_done["errors"]] == ["retrieval_configuration_superseded"]
    assert newer_done["state"] == "succeeded"
    fields = client.get(f"/v0/corpora/{corpus}").json()["retrieval"]["fields"]
    assert fields[-1]["source_pointer"] == "/extensions/example/data/other"
    assert len(search(client, "second", [corpus])["items"]) == 1
    assert search(client, "first", [corpus])["items"] == []


def test_a_rerun_is_held_to_the_original_command_and_never_reverts_a_newer_configuration(own_server, client):
    # part 1 rule 11: "Current scope and command eligibility are revalidated": a rerun needs what the
    # original command needed (Endpoints: configureRetrieval corpora:write and operations:write,
    # rebuildCorpusProjection projections:rebuild), and (state table, docs/decisions.md) rerunning a
    # configuration that a different, later one followed is 409 retrieval_configuration_superseded:
    # the effective configuration is not reverted.
    corpus = create_corpus(client)
    wait_searchable(client, ingest(client, extension_command(corpus, "r1", "Words.", summary="first", other="second")))
    first = wait_terminal(client, configure(client, corpus, [SUMMARY_FIELD]).json()["operation_id"])
    rebuild = wait_terminal(client, client.post(f"/v0/corpora/{corpus}/rebuilds",
                                                json={"idempotency_key": key()}).json()["operation_id"])
    assert (first["state"], rebuild["state"]) == ("succeeded", "succeeded")
    with psycopg.connect(own_server.database_url, autocommit=True) as conn:
        org = conn.execute("SELECT org_id FROM corpora WHERE corpus_id = %s", (corpus,)).fetchone()[0]

    def rerun(c: httpx.Client, operation_id: str, idempotency_key: str | None = None) -> httpx.Response:
        return c.post(f"/v0/operations/{operation_id}/rerun", json={"idempotency_key": idempotency_key or key()})

    with client_for(own_server, key_for(own_server.database_url, org, "operations:read,operations:write")) as ops_only:
        assert_error(rerun(ops_only, first["operation_id"]), 403, "forbidden")
        assert_error(rerun(ops_only, rebuild["operation_id"]), 403, "forbidden")
    with client_for(own_server, key_for(own_server.database_url, org,
                                        "operations:read,operations:write,projections:rebuild")) as rebuilder:
        assert_error(rerun(rebuilder, first["operation_id"]), 403, "forbidden")
        again = rerun(rebuilder, rebuild["operation_id"])
        assert again.status_code == 202, again.text
        assert wait_terminal(rebuilder, again.json()["operation_id"])["state"] == "succeeded"
    with client_for(own_server, key_for(own_server.database_url, org,
                                        "operations:read,operations:write,corpora:write")) as configurer:
        assert_error(rerun(configurer, rebuild["operation_id"]), 403, "forbidden")
        rerun_key = key()
        rerun_first = rerun(configurer, first["operation_id"], rerun_key)
        assert rerun_first.status_code == 202, rerun_first.text  # still the configuration accepted last
        assert wait_terminal(configurer, rerun_first.json()["operation_id"])["state"] == "succeeded"

    other = [{**SUMMARY_FIELD, "source_pointer": "/extensions/example/data/other"}]
    second = wait_terminal(client, configure(client, corpus, other).json()["operation_id"])
    assert second["state"] == "succeeded"
    before = client.get(f"/v0/corpora/{corpus}").json()
    body = assert_error(rerun(client, first["operation_id"]), 409, "retrieval_configuration_superseded")
    assert body["retryable"] is False
    # ... also through the rerun of the older one.
    assert_error(rerun(client, rerun_first.json()["operation_id"]), 409, "retrieval_configuration_superseded")
    # A replay of a rerun accepted before the newer configuration still answers what it answered (rule 11).
    replay = rerun(client, first["operation_id"], rerun_key)
    assert replay.status_code == 202 and replay.json()["operation_id"] == rerun_first.json()["operation_id"]
    assert client.get(f"/v0/corpora/{corpus}").json() == before  # nothing reverted
    assert len(search(client, "second", [corpus])["items"]) == 1
    # The configuration accepted last may be rerun.
    latest = rerun(client, second["operation_id"])
    assert latest.status_code == 202, latest.text
    assert wait_terminal(client, latest.json()["operation_id"])["state"] == "succeeded"
    assert client.get(f"/v0/corpora/{corpus}").json()["retrieval"] == before["retrieval"]


def test_operations_of_other_organizations_and_scopes_are_not_found(own_server, client):
    # decisions.md Scope: a resource looked up by its own id outside the key's reach is 404.
    corpus = create_corpus(client)
    op = client.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": key()}).json()
    with client_for(own_server, new_key(own_server)) as stranger:
        assert_error(stranger.get(f"/v0/operations/{op['operation_id']}"), 404, "not_found")
        assert_error(stranger.post(f"/v0/operations/{op['operation_id']}/cancel"), 404, "not_found")
        assert_error(stranger.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": key()}),
                     404, "not_found")
    with psycopg.connect(own_server.database_url, autocommit=True) as conn:
        org = conn.execute("SELECT org_id FROM corpora WHERE corpus_id = %s", (corpus,)).fetchone()[0]
    scoped = key_for(own_server.database_url, org, corpora="elsewhere")
    with client_for(own_server, scoped) as outside_scope:  # same Organization, Corpus out of scope
        assert_error(outside_scope.get(f"/v0/operations/{op['operation_id']}"), 404, "not_found")
        assert_error(outside_scope.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": key()}),
                     404, "not_found")
    assert_error(client.get("/v0/operations/op_nonexistent"), 404, "not_found")
    assert_error(client.post(f"/v0/corpora/{corpus}/rebuilds", json={}), 422, "invalid_schema")
    wait_terminal(client, op["operation_id"])


def test_operator_replays_one_corpus_from_the_cli(own_server, client):
    # issue: `contentsvc projector replay lexical --corpus C` with a progress bar, then a cutover.
    corpus = create_corpus(client)
    wait_searchable(client, ingest(client, extension_command(corpus, "o1", "Operator rebuild text.")))
    before = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]
    env = {**os.environ, "CONTENTSVC_DATABASE_URL": own_server.database_url, "CONTENTSVC_HOME": str(own_server.home)}
    done = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "replay", "lexical", "--corpus", corpus],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    after = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]
    assert after != before and f"serving {after}" in done.stdout, done.stdout
    assert len(search(client, "operator rebuild", [corpus])["items"]) == 1
    unknown = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "replay", "lexical", "--corpus",
                              "no-such-corpus"], env=env, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "not found" in unknown.stdout


def test_writes_during_a_rebuild_are_all_in_the_generation_it_cuts_over_to(own_server, client):
    # part 1 rule 17 with rules 1 and 3: while a rebuild backfills a new generation, Records keep being
    # ingested, replaced and withdrawn; after the cutover every Record is found by its current Version
    # only, a withdrawn one not at all, whichever side of the backfill's chunks each write fell on.
    corpus, prefix = create_corpus(client), _token("kite")
    base = 10 * CHUNK

    def text(tag: str, i: int) -> str:
        return f"{prefix}{tag}{i:04d} common words of record {i}"

    receipts = [r for start in range(0, base, 100) for r in ingest_batch(
        client, [extension_command(corpus, f"b{i}", text("b", i)) for i in range(start, min(base, start + 100))])]
    for receipt in receipts[-3:]:
        wait_searchable(client, receipt)
    r = client.post(f"/v0/corpora/{corpus}/rebuilds", json={"idempotency_key": key()})
    assert r.status_code == 202, r.text
    operation_id = r.json()["operation_id"]

    replaced, withdrawn, added, last_receipts = set(), set(), 0, []
    during, progress = 0, set()
    for step in range(3 * base):  # bounded; writes go on, paced, until the rebuild ends
        i = (step * 7) % base  # spread over every chunk of the backfill, done and to do
        if step % 3 == 0:
            last_receipts.append(ingest(client, extension_command(corpus, f"b{i}", text("u", i))))
            replaced.add(i)
        elif step % 3 == 1 and i not in replaced:
            w = client.post("/v0/records/withdrawals", json={
                "idempotency_key": key(), "source": {"corpus_id": corpus, "namespace": "test", "record_key": f"b{i}"}})
            assert w.status_code == 202, w.text
            last_receipts.append(w.json()["receipt_id"])
            withdrawn.add(i)
        else:
            last_receipts.append(ingest(client, extension_command(corpus, f"n{added}", text("n", added))))
            added += 1
        now = client.get(f"/v0/operations/{operation_id}").json()
        if now["state"] in ("succeeded", "failed", "canceled"):
            break
        progress.add(now["counters"]["versions_done"])
        during += 1
        time.sleep(0.01)
    op = wait_terminal(client, operation_id)
    assert op["state"] == "succeeded", op
    assert during >= 3, "the rebuild ended before the writes began; the test checks nothing"
    for receipt_id in last_receipts:
        until(lambda: client.get(f"/v0/ingestion-receipts/{receipt_id}").json()["state"] == "resolved",
              f"receipt {receipt_id} resolved")
    wait_searchable(client, ingest(client, extension_command(corpus, "last", text("z", 0))))

    def found(token: str) -> list[str]:
        """The record keys of the hits for a token, each hit checked to be its Record's current Version."""
        keys = []
        for hit in search(client, token, [corpus], limit=5)["items"]:
            record = client.get(f"/v0/records/{hit['record_id']}").json()
            assert record["current_version_id"] == hit["version_id"] and not record["withdrawn"], (token, record)
            keys.append(record["source"]["record_key"])
        return keys

    for i in range(base):
        expected_base = [] if i in replaced or i in withdrawn else [f"b{i}"]
        assert found(f"{prefix}b{i:04d}") == expected_base, (i, i in replaced, i in withdrawn)
        if i in replaced:
            assert found(f"{prefix}u{i:04d}") == [f"b{i}"], i
    for n in range(added):
        assert found(f"{prefix}n{n:04d}") == [f"n{n}"], n
    generation = client.get(f"/v0/corpora/{corpus}").json()["projection_generation_id"]
    assert generation == op["result"]["projection_generation_id"]
    assert documents_of(own_server, generation) == base - len(withdrawn - replaced) + added + 1
