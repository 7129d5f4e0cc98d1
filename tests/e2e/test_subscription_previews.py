"""previewSubscription over a real server with the fixture evaluator pinned by the startup
configuration (part 2 rule 11; decisions-part2 "Monitoring" > "Preview"). The evaluator's
unreachable case runs in test_evaluator_migration.py, whose deployment runs a plugin the test stops."""

from __future__ import annotations

import uuid

from tests.conftest import assert_error, text_command, wait_current, wait_resolved
from tests.e2e.conftest import EVALUATOR_VERSION, corpora, feed_start, new_org, saved_query
from tests.e2e.test_records import ingest, withdraw, withdrawal
from tests.e2e.test_search import wait_searchable


def preview_body(version_id: str, configuration: dict | None = None, **extra) -> dict:
    return {"saved_query_version_id": version_id,
            "evaluator": {"plugin_id": "fixture-evaluator", "version": EVALUATOR_VERSION,
                          "configuration": configuration or {}}, **extra}


def preview(client, body: dict):
    return client.post("/v0/subscription-previews", json=body)


def searchable(client, corpus_id: str, record_key: str, text: str) -> dict:
    """The Version once current and searchable: what a preview may consider."""
    receipt = wait_current(client, wait_searchable(
        client, ingest(client, text_command(corpus_id, record_key, text))["receipt_id"]))
    return {"record_id": receipt["record_id"], "version_id": receipt["version_id"], "corpus_id": corpus_id}


def test_preview_decides_the_newest_current_versions(monitoring):
    client = monitoring.client(new_org())
    [a, b, other] = corpora(client, 3)
    older = searchable(client, a, "r-old", "A crane lifted the hull.")
    replaced = searchable(client, a, "r-two", "First text mentions a crane.")
    withdrawn = searchable(client, b, "r-gone", "The crane is gone.")
    wait_resolved(client, withdraw(client, withdrawal(b, "r-gone"))["receipt_id"])
    plain = searchable(client, b, "r-plain", "Nothing of interest here.")
    current = searchable(client, a, "r-two", "Second text: the CRANE moved.")
    searchable(client, other, "r-else", "A crane outside the query's Corpora.")
    query = saved_query(client, [a, b], {"contains": "crane"})
    cursor = feed_start(client, a)

    r = preview(client, preview_body(query["current_version_id"], {"label": "harbour"},
                                     idempotency_key=uuid.uuid4().hex))
    assert r.status_code == 200, r.text
    answer = r.json()
    # decisions-part2 "Preview": current, searchable, non-withdrawn Versions of its Corpora, newest
    # accepted_at first; a replaced Version, a withdrawn Record and another Corpus are not candidates
    assert [(i["record_id"], i["version_id"], i["corpus_id"]) for i in answer["items"]] == [
        (v["record_id"], v["version_id"], v["corpus_id"]) for v in (current, plain, older)]
    assert replaced["version_id"] not in {i["version_id"] for i in answer["items"]}
    assert withdrawn["record_id"] not in {i["record_id"] for i in answer["items"]}
    # the evaluator's decisions and evidence (decisions-part2 fixture-evaluator: contains)
    assert [i["decision"] for i in answer["items"]] == ["match", "no_match", "match"]
    assert answer["items"][0]["evidence"] == {"explanation": 'contains "crane"', "part_keys": ["body"], "details": {}}
    assert "evidence" not in answer["items"][1]
    assert answer["evaluated"] == 3 and answer["matched"] == 2

    # `limit`: the most recently accepted ones only
    r = preview(client, preview_body(query["current_version_id"], limit=1))
    assert r.status_code == 200 and [i["version_id"] for i in r.json()["items"]] == [current["version_id"]]
    # commits nothing: no change event in the Corpus (decisions-part2 "Preview")
    r = client.get("/v0/changes", params={"corpus_id": a, "cursor": cursor, "limit": 1000})
    assert [e["kind"] for e in r.json()["items"] if e["kind"].startswith(("subscription", "match", "delivery"))] == []


def test_preview_of_an_earlier_version_of_a_deleted_query(monitoring):
    # decisions-part2 "Preview": any readable Saved Query Version, also non-current or of a deleted query
    client = monitoring.client(new_org())
    [a] = corpora(client, 1)
    hit = searchable(client, a, "r-1", "Harbour report")
    query = saved_query(client, [a], {"contains": "harbour"})
    first = query["current_version_id"]
    r = client.post(f"/v0/saved-queries/{query['saved_query_id']}/versions",
                    json={"idempotency_key": uuid.uuid4().hex, "expression": {"contains": "absent"}})
    assert r.status_code == 201, r.text
    assert client.post(f"/v0/saved-queries/{query['saved_query_id']}/delete").status_code == 200
    r = preview(client, preview_body(first))
    assert r.status_code == 200, r.text
    assert [(i["version_id"], i["decision"]) for i in r.json()["items"]] == [(hit["version_id"], "match")]


def test_preview_with_no_candidate_calls_no_evaluator(monitoring):
    client = monitoring.client(new_org())
    [a] = corpora(client, 1)
    query = saved_query(client, [a], {"fail": "terminal"})
    r = preview(client, preview_body(query["current_version_id"]))
    assert r.status_code == 200 and r.json() == {"items": [], "evaluated": 0, "matched": 0}


def test_preview_refusals(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    searchable(client, a, "r-1", "crane")
    query = saved_query(client, [a, b])
    version = query["current_version_id"]
    # rule 3 / decisions-part2 "Preview": unknown, or a Corpus of it not granted: 422 unknown_saved_query
    body = assert_error(preview(client, preview_body("sqv_absent")), 422, "unknown_saved_query")
    assert body["field"] == "/saved_query_version_id"
    assert_error(preview(monitoring.client(org, corpora=a), preview_body(version)), 422, "unknown_saved_query")
    # part 2 Authentication: monitoring:write
    assert_error(preview(monitoring.client(org, actions="monitoring:read"), preview_body(version)), 403, "forbidden")
    # "Same evaluator validation as create" (rule 6)
    r = preview(client, {**preview_body(version), "evaluator": {"plugin_id": "fixture-evaluator", "version": "9.9.9"}})
    assert assert_error(r, 422, "unsupported_evaluator")["field"] == "/evaluator/version"
    r = preview(client, {**preview_body(version), "evaluator": {"plugin_id": "absent", "version": "1.0.0"}})
    assert assert_error(r, 422, "unsupported_evaluator")["field"] == "/evaluator/plugin_id"
    bad = saved_query(client, [a], {"contains": "crane", "unknown_member": 1})
    body = assert_error(preview(client, preview_body(bad["current_version_id"])), 422, "invalid_expression")
    assert body["field"] == "/saved_query_version_id"
    body = assert_error(preview(client, preview_body(version, {"label": ""})), 422,
                        "invalid_subscription_configuration")
    assert body["field"] == "/evaluator/configuration/label"
    # decisions-part2 "Bad input": limit 1..100
    assert_error(preview(client, preview_body(version, limit=101)), 422, "invalid_schema")


def test_preview_evaluator_errors(monitoring):
    client = monitoring.client(new_org())
    [a] = corpora(client, 1)
    searchable(client, a, "r-1", "crane")
    # decisions-part2 "Preview": a terminal error is 502 evaluator_failed
    terminal = saved_query(client, [a], {"fail": "terminal"})
    body = assert_error(preview(client, preview_body(terminal["current_version_id"])), 502, "evaluator_failed")
    assert "fixture_failure" in body["message"]
    # a retryable error is transient like unreachability: 503 evaluator_unavailable with Retry-After
    # (docs/decisions.md "Subscription previews")
    retryable = saved_query(client, [a], {"fail": "retryable"})
    r = preview(client, preview_body(retryable["current_version_id"]))
    assert assert_error(r, 503, "evaluator_unavailable")["retryable"] is True
    assert int(r.headers["retry-after"]) >= 1
