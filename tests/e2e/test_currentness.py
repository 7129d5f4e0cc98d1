"""Receipts that always end, and currentness that moves only when a newer Version can serve.

Against a real `contentsvc run`. Part 1 "Diagnostic" (`normalization_superseded`:
a newer revision was accepted before normalization; Version quarantined and
never current), "ProcessingSummary" (`idle`: no pending work), "States and
transitions" (agent stop conditions; a Version still building reports
`is_current` false until it becomes current), rule 20 and decisions.md
"Search" (a hit only for a current, searchable Version).
"""

from __future__ import annotations

import time
import uuid

import httpx
import psycopg

from tests.conftest import create_corpus, text_command, wait_resolved
from tests.e2e.test_search import _token, ingest, ingest_batch, search, wait_searchable
from tests.e2e.test_uploads import blob_command, verified_blob
from tests.e2e.test_records import get_record

IDLE = {"state": "idle"}


def _cid() -> str:
    return f"cur-{uuid.uuid4().hex[:10]}"


def receipt_of(client: httpx.Client, receipt_id: str) -> dict:
    r = client.get(f"/v0/ingestion-receipts/{receipt_id}")
    assert r.status_code == 200, r.text
    return r.json()


def hit_versions(client: httpx.Client, query: str, corpus_id: str) -> set[str]:
    return {hit["version_id"] for hit in search(client, query, [corpus_id])["items"]}


def assert_honest(receipt: dict) -> None:
    # part1 "States and transitions": a Version still building reports is_current false until it
    # becomes current; current and searchable move together, only at retrieval_ready.
    availability = receipt.get("availability")
    if availability is None:
        return
    if availability["is_current"] or availability["searchable"]:
        assert availability == {"state": "retrieval_ready", "is_current": True, "searchable": True}, receipt
    if availability["state"] in ("materialized", "building_baseline"):
        assert availability["is_current"] is False and availability["searchable"] is False, receipt


def wait_ended(client: httpx.Client, receipt_id: str, timeout: float = 40.0) -> dict:
    """Follows a Receipt as an agent does, until a stop condition of part 1 "States and
    transitions" with nothing pending (processing idle)."""
    deadline = time.time() + timeout
    receipt: dict = {}
    while time.time() < deadline:
        receipt = receipt_of(client, receipt_id)
        assert_honest(receipt)
        availability = receipt.get("availability") or {}
        stopped = availability.get("state") == "quarantined" or (
            availability.get("state") == "retrieval_ready" and availability.get("is_current") is False)
        if stopped and receipt["processing"] == IDLE:
            return receipt
        time.sleep(0.05)
    raise AssertionError(f"receipt {receipt_id} never reached a stop condition: {receipt}")


def assert_superseded(receipt: dict) -> None:
    # part1 "Diagnostic": normalization_superseded; Version quarantined and never current.
    assert receipt["state"] == "resolved" and receipt["outcome"] == "created", receipt
    assert [d["code"] for d in receipt["diagnostics"]] == ["normalization_superseded"], receipt
    assert receipt["diagnostics"][0]["retryable"] is False
    assert receipt["availability"] == {"state": "quarantined", "is_current": False, "searchable": False}
    assert receipt["processing"] == IDLE  # part1 "ProcessingSummary": idle, no pending work


def test_two_revisions_in_one_batch_end_the_first(api):
    corpus = create_corpus(api, _cid())
    first_tok, second_tok = _token("first"), _token("second")
    r1, r2 = ingest_batch(api, [text_command(corpus, "doc", f"draft {first_tok}"),
                                text_command(corpus, "doc", f"final {second_tok}")])
    # Both entries were accepted together: the first was superseded before it was normalized.
    first = wait_ended(api, r1)
    assert_superseded(first)
    second = wait_searchable(api, r2)
    assert second["record_id"] == first["record_id"] and second["version_id"] != first["version_id"]
    assert second["availability"] == {"state": "retrieval_ready", "is_current": True, "searchable": True}
    assert get_record(api, first["record_id"])["current_version_id"] == second["version_id"]
    assert hit_versions(api, second_tok, corpus) == {second["version_id"]}
    assert hit_versions(api, first_tok, corpus) == set()  # never current, never a hit
    assert_superseded(receipt_of(api, r1))  # and it stays ended


def test_back_to_back_revisions_end_the_first(api):
    # Whatever the interleaving of the materializer and the lexical projector (both revisions in
    # one batch of either, or in two), the first Receipt reaches a stop condition with nothing
    # pending, and the last revision becomes current and searchable.
    corpus = create_corpus(api, _cid())
    pairs = []
    for i in range(6):
        toks = (_token("early"), _token("late"))
        pairs.append((ingest(api, text_command(corpus, f"doc-{i}", f"early {toks[0]}")),
                      ingest(api, text_command(corpus, f"doc-{i}", f"late {toks[1]}")), toks))
    for r1, r2, (early, late) in pairs:
        second = wait_searchable(api, r2)
        first = wait_ended(api, r1)
        assert first["outcome"] == "created" and first["version_id"] != second["version_id"]
        if first["availability"]["state"] == "quarantined":
            assert_superseded(first)
        else:  # part1 stop condition: retrieval_ready with is_current false (a newer text replaced it)
            assert first["availability"] == {"state": "retrieval_ready", "is_current": False, "searchable": False}
            assert first["diagnostics"] == []
        assert get_record(api, second["record_id"])["current_version_id"] == second["version_id"]
        assert hit_versions(api, late, corpus) == {second["version_id"]}
        assert hit_versions(api, early, corpus) == set()


def test_correction_is_not_current_until_searchable_and_old_text_serves_meanwhile(api, database_url):
    corpus = create_corpus(api, _cid())
    old_tok, new_tok = _token("old"), _token("new")
    old = wait_searchable(api, ingest(api, text_command(corpus, "doc", f"old text {old_tok}")))
    r2 = ingest(api, text_command(corpus, "doc", f"new text {new_tok}"))
    deadline = time.time() + 40
    while True:
        assert time.time() < deadline, "the correction never became searchable"
        # Read in this order: search, then the Receipt. A search that no longer finds the old text
        # ran after the new Version became current, so the later Receipt read must say so.
        old_hits = hit_versions(api, old_tok, corpus)
        receipt = receipt_of(api, r2)
        assert_honest(receipt)
        availability = receipt.get("availability") or {}
        if not old_hits:
            assert availability.get("searchable") is True, receipt
        else:  # the previous Version stays current and searchable until the new one can serve
            assert old_hits == {old["version_id"]}
        if availability.get("searchable"):
            break
        time.sleep(0.02)
    new = receipt
    assert get_record(api, old["record_id"])["current_version_id"] == new["version_id"]
    assert hit_versions(api, new_tok, corpus) == {new["version_id"]}
    assert hit_versions(api, old_tok, corpus) == set()
    # The old Receipt: retrieval_ready, no longer current (an agent stop condition), idle.
    replaced = receipt_of(api, old["receipt_id"])
    assert replaced["availability"] == {"state": "retrieval_ready", "is_current": False, "searchable": False}
    assert replaced["processing"] == IDLE

    # The journal: the one event that makes the new Version current is retrieval_ready, current
    # and searchable (monitoring triggers on it); every earlier one says not current; the old
    # Version's currentness ends just before it.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT version_id, payload->>'state', (payload->>'is_current')::boolean,"
            " (payload->>'searchable')::boolean FROM journal"
            " WHERE kind = 'record.availability_changed' AND subject_id = %s ORDER BY position",
            (old["record_id"],)).fetchall()
    new_moves = [r[1:] for r in rows if r[0] == new["version_id"]]
    assert new_moves == [("materialized", False, False), ("building_baseline", False, False),
                         ("retrieval_ready", True, True)], rows
    made_current = rows.index((new["version_id"], "retrieval_ready", True, True))
    assert rows[made_current - 1] == (old["version_id"], None, False, None), rows
    assert [r for r in rows if r[2]] == [(old["version_id"], "retrieval_ready", True, True),
                                         (new["version_id"], "retrieval_ready", True, True)], rows

    # The replaced Version then leaves the index: the lexical fold finds the Record among those
    # to retire once the read model shows its new Version current, and marks it retired.
    deadline = time.time() + 20
    while True:
        with psycopg.connect(database_url) as conn:
            retired = conn.execute("SELECT version_id, retired FROM lexical_currentness WHERE record_id = %s",
                                   (old["record_id"],)).fetchone()
        if retired == (new["version_id"], True):
            break
        assert time.time() < deadline, retired
        time.sleep(0.05)


def test_quarantined_correction_leaves_the_previous_version_current(api):
    corpus = create_corpus(api, _cid())
    tok = _token("kept")
    command = text_command(corpus, "doc", f"readable text {tok}")
    old = wait_searchable(api, ingest(api, command))
    blob = verified_blob(api, b"caf\xe9 \xff\xfe not utf-8", "text/plain")
    bad = {**blob_command(corpus, "doc", blob["blob_id"], "text/plain"), "source": command["source"]}
    quarantined = wait_resolved(api, ingest(api, bad))
    assert quarantined["record_id"] == old["record_id"]
    assert [d["code"] for d in quarantined["diagnostics"]] == ["normalizer_failed"]
    # part1 "Diagnostic" / "States and transitions": quarantined, never current; a stop condition.
    assert quarantined["availability"] == {"state": "quarantined", "is_current": False, "searchable": False}
    assert quarantined["processing"] == IDLE
    # A later Version in the same Corpus becoming searchable means the index has passed the
    # quarantined one (the lexical projector folds in journal order).
    wait_searchable(api, ingest(api, text_command(corpus, "later", f"later text {_token()}")))
    assert get_record(api, old["record_id"])["current_version_id"] == old["version_id"]
    assert receipt_of(api, old["receipt_id"])["availability"] == {
        "state": "retrieval_ready", "is_current": True, "searchable": True}
    assert hit_versions(api, tok, corpus) == {old["version_id"]}  # the earlier text stays findable
    assert receipt_of(api, quarantined["receipt_id"])["availability"]["is_current"] is False
