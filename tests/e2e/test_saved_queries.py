"""Saved Queries over a real server (part 2 "Saved queries and subscriptions" rules 1-4, "Saved
Query" states; decisions-part2 "Monitoring" > "Saved queries", "Change-feed event kinds added")."""

from __future__ import annotations

import uuid

from tests.e2e.conftest import corpora, feed_start, kinds_until, new_org, saved_query


def test_create_replay_and_conflict(monitoring):
    client = monitoring.client(new_org())
    [a, b] = corpora(client, 2)
    body = {"idempotency_key": uuid.uuid4().hex, "name": "Cranes", "corpus_ids": [a, b],
            "expression": {"contains": "crane"}}
    r = client.post("/v0/saved-queries", json=body)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["saved_query_id"].startswith("sq_") and created["current_version_id"].startswith("sqv_")
    assert created["corpus_ids"] == [a, b] and created["deleted"] is False and created["name"] == "Cranes"
    assert r.headers["location"] == f"/v0/saved-queries/{created['saved_query_id']}"
    # rule 1: the same key and request replay the same ids (200); a changed request conflicts
    r = client.post("/v0/saved-queries", json=body)
    assert r.status_code == 200 and r.json() == created
    r = client.post("/v0/saved-queries", json={**body, "name": "Other"})
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    r = client.get(f"/v0/saved-queries/{created['saved_query_id']}/versions/{created['current_version_id']}")
    assert r.status_code == 200, r.text
    assert r.json()["expression"] == {"contains": "crane"} and r.json()["corpus_ids"] == [a, b]


def test_corpus_ids_and_expression_bounds(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b] = corpora(client, 2)
    scoped = monitoring.client(org, corpora=a)

    def create(c, **body):
        return c.post("/v0/saved-queries", json={"idempotency_key": uuid.uuid4().hex, "name": "q",
                                                  "expression": {"contains": "x"}, **body})

    # decisions-part2 "Saved queries": a Corpus outside the key's scope is 403 with its pointer ...
    r = create(scoped, corpus_ids=[a, b])
    assert r.status_code == 403 and r.json()["code"] == "forbidden" and r.json()["field"] == "/corpus_ids/1"
    # ... one in scope but absent is 404
    r = create(client, corpus_ids=[a, "no-such-corpus"])
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    # 1..16 unique corpus ids, an expression at most 64 KiB serialized
    r = create(client, corpus_ids=[a, a])
    assert r.status_code == 422 and r.json()["code"] == "invalid_schema" and r.json()["field"] == "/corpus_ids"
    r = create(client, corpus_ids=[f"c{n}" for n in range(17)])
    assert r.status_code == 422 and r.json()["field"] == "/corpus_ids"
    r = create(client, corpus_ids=[a], expression={"contains": "x" * (64 * 1024)})
    assert r.status_code == 422 and r.json()["code"] == "invalid_schema" and r.json()["field"] == "/expression"
    r = create(client, corpus_ids=[a], expression=["not", "an", "object"])
    assert r.status_code == 422 and r.json()["field"] == "/expression"
    # permissions: writes need monitoring:write
    reader = monitoring.client(org, actions="monitoring:read")
    r = create(reader, corpus_ids=[a])
    assert r.status_code == 403 and r.json()["code"] == "forbidden"


def test_new_versions_move_the_scope_and_announce_it_in_every_corpus(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a, b, c] = corpora(client, 3)
    cursors = {x: feed_start(client, x) for x in (a, b, c)}
    blind = monitoring.client(org, actions="changes:read")
    blind_cursor = feed_start(blind, b)
    created = saved_query(client, [a, b])
    sq = created["saved_query_id"]
    body = {"idempotency_key": uuid.uuid4().hex, "corpus_ids": [b, c], "expression": {"contains": "hoist"}}
    r = client.post(f"/v0/saved-queries/{sq}/versions", json=body)
    assert r.status_code == 201, r.text
    version = r.json()
    assert version["corpus_ids"] == [b, c] and version["saved_query_id"] == sq
    # replay: the same Version (200); a changed request conflicts
    r = client.post(f"/v0/saved-queries/{sq}/versions", json=body)
    assert r.status_code == 200 and r.json() == version
    r = client.post(f"/v0/saved-queries/{sq}/versions", json={**body, "expression": {"contains": "jib"}})
    assert r.status_code == 409 and r.json()["code"] == "idempotency_conflict"
    head = client.get(f"/v0/saved-queries/{sq}").json()
    assert head["current_version_id"] == version["version_id"] and head["corpus_ids"] == [b, c]
    # omitted corpus_ids keep the current scope
    r = client.post(f"/v0/saved-queries/{sq}/versions", json={"idempotency_key": uuid.uuid4().hex,
                                                               "expression": {"contains": "boom"}})
    assert r.status_code == 201 and r.json()["corpus_ids"] == [b, c]
    # decisions-part2: creation commits saved_query.updated in each Corpus of the scope; rule 2: a new
    # Version in every Corpus of the previous and new scope
    assert [e["kind"] for e in kinds_until(client, a, cursors[a], ["saved_query.updated"] * 2)] == \
        ["saved_query.updated"] * 2
    feed_b = kinds_until(client, b, cursors[b], ["saved_query.updated"] * 3)
    assert [e["kind"] for e in feed_b] == ["saved_query.updated"] * 3
    assert feed_b[0]["subject"] == {"type": "saved_query", "id": sq}
    assert [e["kind"] for e in kinds_until(client, c, cursors[c], ["saved_query.updated"] * 2)] == \
        ["saved_query.updated"] * 2
    # decisions-part2 "Change-feed event kinds added": saved_query.* need monitoring:read
    assert kinds_until(blind, b, blind_cursor, [], timeout=0) == []

    # rule 3: a key must grant the current Version's Corpora (and an earlier Version's) to read them
    scoped = monitoring.client(org, corpora=f"{b},{c}")
    assert scoped.get(f"/v0/saved-queries/{sq}").status_code == 200
    assert scoped.get(f"/v0/saved-queries/{sq}/versions/{version['version_id']}").status_code == 200
    r = scoped.get(f"/v0/saved-queries/{sq}/versions/{created['current_version_id']}")  # pinned a
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert monitoring.client(org, corpora=b).get(f"/v0/saved-queries/{sq}").status_code == 404
    # rule 2: a new Version needs the current and new Corpora granted
    r = scoped.post(f"/v0/saved-queries/{sq}/versions", json={"idempotency_key": uuid.uuid4().hex,
                                                               "corpus_ids": [a], "expression": {}})
    assert r.status_code == 403 and r.json()["field"] == "/corpus_ids/0"
    assert monitoring.client(new_org()).get(f"/v0/saved-queries/{sq}").status_code == 404  # another Organization


def test_rename_and_delete(monitoring):
    org = new_org()
    client = monitoring.client(org)
    [a] = corpora(client, 1)
    cursor = feed_start(client, a)
    created = saved_query(client, [a])
    sq = created["saved_query_id"]
    # rule 4: rename changes only the name, with saved_query.renamed only for a new name
    r = client.post(f"/v0/saved-queries/{sq}/rename", json={"idempotency_key": uuid.uuid4().hex, "name": "Hoists"})
    assert r.status_code == 200 and r.json()["name"] == "Hoists"
    assert r.json()["current_version_id"] == created["current_version_id"]
    r = client.post(f"/v0/saved-queries/{sq}/rename", json={"idempotency_key": uuid.uuid4().hex, "name": "Hoists"})
    assert r.status_code == 200
    # rule 4: delete emits saved_query.deleted; a repeat commits nothing
    r = client.post(f"/v0/saved-queries/{sq}/delete", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 200 and r.json()["deleted"] is True
    r = client.post(f"/v0/saved-queries/{sq}/delete")
    assert r.status_code == 200 and r.json()["deleted"] is True
    expected = ["saved_query.updated", "saved_query.renamed", "saved_query.deleted"]
    assert [e["kind"] for e in kinds_until(client, a, cursor, expected)] == expected
    # part 2 "Saved Query": a deleted query blocks new Versions and renames (409 saved_query_deleted) ...
    r = client.post(f"/v0/saved-queries/{sq}/versions", json={"idempotency_key": uuid.uuid4().hex,
                                                               "expression": {"contains": "x"}})
    assert r.status_code == 409 and r.json()["code"] == "saved_query_deleted"
    r = client.post(f"/v0/saved-queries/{sq}/rename", json={"idempotency_key": uuid.uuid4().hex, "name": "Again"})
    assert r.status_code == 409 and r.json()["code"] == "saved_query_deleted"
    # ... and stays readable with its Versions (rule 3)
    assert client.get(f"/v0/saved-queries/{sq}").json()["deleted"] is True
    assert client.get(f"/v0/saved-queries/{sq}/versions/{created['current_version_id']}").status_code == 200
    assert client.get("/v0/saved-queries/sq_unknown").status_code == 404
