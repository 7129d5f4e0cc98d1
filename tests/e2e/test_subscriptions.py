"""Subscriptions over a real server with the fixture evaluator pinned by the startup configuration
(part 2 "Subscription Version", "Subscription" states, rules 5-9; decisions-part2 "Monitoring" >
"Subscriptions", "Destinations", "Errors added")."""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.conftest import (
    DESTINATION,
    corpora,
    feed_start,
    kinds_until,
    new_org,
    saved_query,
    subscription_body,
    version_body,
)


def _create(client, body):
    return client.post("/v0/subscriptions", json=body)


def test_create_read_replay_and_conflict(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    cursor = feed_start(client, b)
    query = saved_query(client, [a, b])
    body = subscription_body(query["current_version_id"], owner="user-17")
    r = _create(client, body)
    assert r.status_code == 201, r.text
    sub = r.json()
    # decisions-part2 "Subscriptions": the view, evaluation pending 0 until the monitor runs
    assert sub["subscription_id"].startswith("sub_") and sub["current_version_id"].startswith("subv_")
    assert sub["enabled"] is True and sub["deleted"] is False and sub["owner"] == "user-17"
    assert sub["saved_query_id"] == query["saved_query_id"] and sub["evaluation"] == {"pending": 0}
    version = client.get(f"/v0/subscriptions/{sub['subscription_id']}/versions/{sub['current_version_id']}").json()
    assert version["saved_query_version_id"] == query["current_version_id"]
    assert version["evaluator"] == {"plugin_id": "fixture-evaluator", "version": "0.1.0", "configuration": {}}
    assert version["destination_id"] == DESTINATION and version["owner"] == "user-17"
    assert version["activated_at"] == version["created_at"]
    # rule 6 / decisions-part2: replay 200 the same Subscription; a changed request 409
    r = _create(client, body)
    assert r.status_code == 200 and r.json()["subscription_id"] == sub["subscription_id"]
    r = _create(client, {**body, "name": "Other"})
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    # a replay of a since disabled one returns it disabled
    client.post(f"/v0/subscriptions/{sub['subscription_id']}/disable")
    r = _create(client, body)
    assert r.status_code == 200 and r.json()["enabled"] is False
    # decisions-part2: creation commits subscription.updated in each Corpus of the pinned scope
    feed = kinds_until(client, b, cursor, ["saved_query.updated", "subscription.updated", "subscription.updated"])
    assert [e["kind"] for e in feed] == ["saved_query.updated", "subscription.updated", "subscription.updated"]
    assert feed[1]["subject"] == {"type": "subscription", "id": sub["subscription_id"]}
    # rule 8: reading needs every pinned Corpus granted
    assert monitoring.client(org, corpora=a).get(f"/v0/subscriptions/{sub['subscription_id']}").status_code == 404
    assert monitoring.client(org, actions="monitoring:read").get(
        f"/v0/subscriptions/{sub['subscription_id']}").status_code == 200


@pytest.mark.parametrize("owner", ["", "x" * 129, "tab\there", "none"])
def test_invalid_owner(monitoring, owner):
    # part 2 Subscription Version `owner`; decisions-part2: `none` is reserved for the filter
    client = monitoring.client(new_org())
    [a] = corpora(client, 1)
    query = saved_query(client, [a])
    r = _create(client, subscription_body(query["current_version_id"], owner=owner))
    assert r.status_code == 422 and r.json()["code"] == "invalid_owner" and r.json()["field"] == "/owner"


def test_validation_of_the_pin(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    query = saved_query(client, [a])
    current = query["current_version_id"]

    def refused(body, status, code, field):
        r = _create(client, body)
        assert (r.status_code, r.json()["code"], r.json().get("field")) == (status, code, field), r.text
        return r.json()

    # decisions-part2: unknown, out of scope or not current is 422 unknown_saved_query
    refused(subscription_body("sqv_unknown"), 422, "unknown_saved_query", "/saved_query_version_id")
    r = client.post(f"/v0/saved-queries/{query['saved_query_id']}/versions",
                    json={"idempotency_key": uuid.uuid4().hex, "expression": {"contains": "hoist"}})
    newer = r.json()["version_id"]
    refused(subscription_body(current), 422, "unknown_saved_query", "/saved_query_version_id")
    other_scope = saved_query(client, [b])
    r = _create(monitoring.client(org, corpora=a), subscription_body(other_scope["current_version_id"]))
    assert r.status_code == 422 and r.json()["code"] == "unknown_saved_query"
    # the installed evaluator is the version the active plan serves (422 unsupported_evaluator)
    body = subscription_body(newer)
    refused({**body, "evaluator": {**body["evaluator"], "plugin_id": "query"}}, 422, "unsupported_evaluator",
            "/evaluator/plugin_id")
    message = refused({**body, "evaluator": {**body["evaluator"], "version": "9.9.9"}}, 422, "unsupported_evaluator",
                      "/evaluator/version")["message"]
    assert "0.1.0" in message
    # rule 6: the expression and configuration against the evaluator's schemas, naming the first issue
    bad = saved_query(client, [a], expression={"matches": "crane"})
    message = refused(subscription_body(bad["current_version_id"]), 422, "invalid_expression",
                      "/saved_query_version_id")["message"]
    assert "matches" in message
    message = refused({**body, "evaluator": {**body["evaluator"], "configuration": {"label": ""}}}, 422,
                      "invalid_subscription_configuration", "/evaluator/configuration/label")["message"]
    assert "label" in message or "short" in message
    # decisions-part2 "Destinations": only the startup file's (422 unknown_destination)
    refused({**body, "destination_id": "elsewhere"}, 422, "unknown_destination", "/destination_id")
    # a deleted Saved Query takes no new Subscription (409 saved_query_deleted)
    gone = saved_query(client, [a])
    assert client.post(f"/v0/saved-queries/{gone['saved_query_id']}/delete").status_code == 200
    refused(subscription_body(gone["current_version_id"]), 409, "saved_query_deleted", None)
    # every refusal rolled back its key's claim: the same key is free for a valid request
    assert _create(client, {**body, "idempotency_key": body["idempotency_key"]}).status_code == 201


def test_states_and_the_saved_query_in_use(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a] = corpora(client, 1)
    cursor = feed_start(client, a)
    query = saved_query(client, [a])
    sub = _create(client, subscription_body(query["current_version_id"])).json()
    sid = sub["subscription_id"]
    # part 2 Saved Query: deletion needs no non-deleted Subscription on it (409 saved_query_in_use)
    r = client.post(f"/v0/saved-queries/{query['saved_query_id']}/delete")
    assert r.status_code == 409 and r.json()["code"] == "saved_query_in_use"
    # part 2 Subscription states: disable, repeat (no event), enable (same Version), repeat
    r = client.post(f"/v0/subscriptions/{sid}/disable", json={"idempotency_key": "d1"})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["disabled_reason"] == "disabled"
    assert client.post(f"/v0/subscriptions/{sid}/disable").json()["enabled"] is False
    r = client.post(f"/v0/subscriptions/{sid}/enable")
    assert r.status_code == 200 and r.json()["enabled"] is True and "disabled_reason" not in r.json()
    assert r.json()["current_version_id"] == sub["current_version_id"]
    assert client.post(f"/v0/subscriptions/{sid}/enable").status_code == 200
    # rule 9: rename, only a new name is announced
    r = client.post(f"/v0/subscriptions/{sid}/rename", json={"idempotency_key": uuid.uuid4().hex, "name": "Hoists"})
    assert r.status_code == 200 and r.json()["name"] == "Hoists"
    assert client.post(f"/v0/subscriptions/{sid}/rename",
                       json={"idempotency_key": uuid.uuid4().hex, "name": "Hoists"}).status_code == 200
    # delete: also disabled with reason subscription_deleted; a repeat commits nothing
    r = client.post(f"/v0/subscriptions/{sid}/delete")
    assert r.status_code == 200
    assert (r.json()["deleted"], r.json()["enabled"], r.json()["disabled_reason"]) == (True, False,
                                                                                        "subscription_deleted")
    assert client.post(f"/v0/subscriptions/{sid}/delete").status_code == 200
    # deleted: enable and edits are 409 subscription_deleted; disable changes nothing; still readable
    for path, body in (("enable", None), ("rename", {"idempotency_key": uuid.uuid4().hex, "name": "x"}),
                       ("versions", version_body(query["current_version_id"]))):
        r = client.post(f"/v0/subscriptions/{sid}/{path}", json=body)
        assert r.status_code == 409 and r.json()["code"] == "subscription_deleted", path
    assert client.post(f"/v0/subscriptions/{sid}/disable").status_code == 200
    assert client.get(f"/v0/subscriptions/{sid}/versions/{sub['current_version_id']}").status_code == 200
    expected = ["saved_query.updated", "subscription.updated", "subscription.updated", "subscription.updated",
                "subscription.renamed", "subscription.deleted"]
    assert [e["kind"] for e in kinds_until(client, a, cursor, expected)] == expected
    # the query is free once its Subscription is deleted
    assert client.post(f"/v0/saved-queries/{query['saved_query_id']}/delete").status_code == 200


def test_new_versions(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    query = saved_query(client, [a])
    sub = _create(client, subscription_body(query["current_version_id"], owner="u1")).json()
    sid = sub["subscription_id"]
    client.post(f"/v0/subscriptions/{sid}/disable")
    r = client.post(f"/v0/saved-queries/{query['saved_query_id']}/versions",
                    json={"idempotency_key": uuid.uuid4().hex, "corpus_ids": [a, b], "expression": {"contains": "jib"}})
    newer = r.json()["version_id"]
    cursor = feed_start(client, b)
    body = version_body(newer)
    body["evaluator"]["configuration"] = {"label": "jib"}
    r = client.post(f"/v0/subscriptions/{sid}/versions", json=body)
    assert r.status_code == 201, r.text
    version = r.json()
    # rule 7: a new current Version; every Version keeps the owner; enabled state unchanged
    assert version["saved_query_version_id"] == newer and version["owner"] == "u1"
    assert version["evaluator"]["configuration"] == {"label": "jib"}
    head = client.get(f"/v0/subscriptions/{sid}").json()
    assert head["current_version_id"] == version["version_id"] and head["enabled"] is False
    # the earlier Version stays readable
    assert client.get(f"/v0/subscriptions/{sid}/versions/{sub['current_version_id']}").status_code == 200
    # replay 200 the same Version; a changed request 409
    r = client.post(f"/v0/subscriptions/{sid}/versions", json=body)
    assert r.status_code == 200 and r.json() == version
    r = client.post(f"/v0/subscriptions/{sid}/versions", json={**body, "destination_id": "elsewhere"})
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    # `owner` is not a member of the create-version request (422 invalid_schema)
    r = client.post(f"/v0/subscriptions/{sid}/versions", json={**version_body(newer), "owner": "u2"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_schema" and r.json()["field"] == "/owner"
    # rule 7: only the current Version of the Subscription's own Saved Query
    other = saved_query(client, [a])
    r = client.post(f"/v0/subscriptions/{sid}/versions", json=version_body(other["current_version_id"]))
    assert r.status_code == 422 and r.json()["code"] == "unknown_saved_query"
    # rule 7: subscription.updated in the new scope (b); rule 8: b is now needed to read it
    assert [e["kind"] for e in kinds_until(client, b, cursor, ["subscription.updated"])] == ["subscription.updated"]
    assert monitoring.client(org, corpora=a).get(f"/v0/subscriptions/{sid}").status_code == 404


def test_list_by_owner_with_cursors(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    query = saved_query(client, [a])
    wide = saved_query(client, [a, b])
    ids = {}
    for name, owner, version in (("o1", "alice", query), ("o2", "alice", query), ("o3", "alice", wide),
                                 ("g1", None, query), ("off", "alice", query)):
        body = subscription_body(version["current_version_id"], **({"owner": owner} if owner else {}))
        ids[name] = _create(client, body).json()["subscription_id"]
    client.post(f"/v0/subscriptions/{ids['off']}/disable")

    def page(c, **params):
        r = c.get("/v0/subscriptions", params=params)
        assert r.status_code == 200, r.text
        return r.json()

    # rule 5: active Subscriptions of one owner in id order, paged; the disabled one is left out
    first = page(client, owner="alice", limit=2)
    assert [s["subscription_id"] for s in first["items"]] == [ids["o1"], ids["o2"]]
    second = page(client, owner="alice", limit=2, page_cursor=first["next_page_cursor"])
    assert [s["subscription_id"] for s in second["items"]] == [ids["o3"]] and "next_page_cursor" not in second
    # owner=none: the global ones; no owner filter: every active one the key sees
    assert [s["subscription_id"] for s in page(client, owner="none")["items"]] == [ids["g1"]]
    assert [s["subscription_id"] for s in page(client)["items"]] == [ids["o1"], ids["o2"], ids["o3"], ids["g1"]]
    # only those the key sees (rule 8 scope)
    scoped = monitoring.client(org, corpora=a)
    assert [s["subscription_id"] for s in page(scoped, owner="alice")["items"]] == [ids["o1"], ids["o2"]]
    # the cursor is bound to the owner filter and the key scope
    r = client.get("/v0/subscriptions", params={"owner": "bob", "page_cursor": first["next_page_cursor"]})
    assert r.status_code == 409 and r.json()["code"] == "cursor_scope_changed"
    r = scoped.get("/v0/subscriptions", params={"owner": "alice", "page_cursor": first["next_page_cursor"]})
    assert r.status_code == 409 and r.json()["code"] == "cursor_scope_changed"
    r = client.get("/v0/subscriptions", params={"owner": "tab\there"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_owner"
    assert page(monitoring.client(new_org()), owner="alice")["items"] == []
