"""Corpora over real HTTP: createCorpus, listCorpora, getCorpus.

Covers part 1 rules 13 and 14, the Conventions on idempotency and paging,
Authentication 3, and decisions.md "Corpora".
"""

from __future__ import annotations

import re
import time
import uuid

import httpx

from tests.conftest import assert_error, client_for, create_corpus

CORPUS_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def _cid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def corpus_request(corpus_id: str | None = None, name: str = "A corpus", key: str | None = None, **extra) -> dict:
    body = {"idempotency_key": key or uuid.uuid4().hex, "name": name, **extra}
    if corpus_id is not None:
        body["corpus_id"] = corpus_id
    return body


def list_pages(client: httpx.Client, limit: int | None = None) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        params = {} if limit is None else {"limit": limit}
        if cursor:
            params["page_cursor"] = cursor
        r = client.get("/v0/corpora", params=params)
        assert r.status_code == 200, r.text
        assert set(r.json()) <= {"items", "next_page_cursor"}
        pages.append(r.json()["items"])
        cursor = r.json().get("next_page_cursor")
        if cursor is None:
            return pages
        assert len(pages) < 50


def test_create_corpus_then_replay(api):
    corpus_id = _cid()
    req = corpus_request(corpus_id, name="Papers")
    r = api.post("/v0/corpora", json=req)
    # decisions.md Corpora: 201 on first creation, the Corpus shape.
    assert r.status_code == 201, r.text
    corpus = r.json()
    assert set(corpus) == {"corpus_id", "name", "created_at", "retrieval", "projection_generation_id",
                           "vector_spaces"}
    assert corpus["corpus_id"] == corpus_id and corpus["name"] == "Papers"
    assert corpus["projection_generation_id"].startswith("gen_")
    assert corpus["vector_spaces"] == ["minilm_l6_v2"]  # the engine's space, on by default
    # decisions.md Corpora: default retrieval is profile "default" with fields title and body.
    assert corpus["retrieval"]["plugin_profile"] == "default"
    assert [f["name"] for f in corpus["retrieval"]["fields"]] == ["title", "body"]
    assert all(f["roles"] == ["search"] for f in corpus["retrieval"]["fields"])

    # part1 rule 13 + decisions.md Corpora: replay answers 200 with the same Corpus.
    replay = api.post("/v0/corpora", json=req)
    assert replay.status_code == 200, replay.text
    assert replay.json() == corpus
    # Conventions: same key, different request -> 409 idempotency_conflict.
    assert_error(api.post("/v0/corpora", json=dict(req, name="Other name")), 409, "idempotency_conflict")
    # decisions.md Corpora: the id taken by a different request -> 409 corpus_exists.
    body = assert_error(api.post("/v0/corpora", json=corpus_request(corpus_id, name="Papers")), 409, "corpus_exists")
    assert body.get("field", "/corpus_id") == "/corpus_id"
    # getCorpus reads the same Corpus with its effective configuration.
    got = api.get(f"/v0/corpora/{corpus_id}")
    assert got.status_code == 200 and got.json() == corpus


def test_generated_corpus_id(api):
    r = api.post("/v0/corpora", json=corpus_request(name="No id given"))
    assert r.status_code == 201, r.text
    corpus_id = r.json()["corpus_id"]
    # decisions.md Corpora: generated when not given; it is a valid Corpus id.
    assert CORPUS_ID.match(corpus_id), corpus_id
    assert api.get(f"/v0/corpora/{corpus_id}").json()["name"] == "No id given"


def test_create_corpus_invalid_requests(api):
    # decisions.md Corpora: corpus_id pattern ^[a-z0-9][a-z0-9_-]{0,62}$ -> 422 invalid_schema at /corpus_id.
    for bad in ("Upper", "has space", "-leading", "_leading", "x" * 64, "", "caf\u00e9", "a/b"):
        body = assert_error(api.post("/v0/corpora", json=corpus_request(bad)), 422, "invalid_schema")
        assert body["field"] == "/corpus_id", (bad, body)
    assert api.post("/v0/corpora", json=corpus_request("a" * 63)).status_code == 201
    # decisions.md Corpora: name 1..200 characters.
    for bad_name in ("", "n" * 201):
        body = assert_error(api.post("/v0/corpora", json=corpus_request(_cid(), name=bad_name)),
                            422, "invalid_schema")
        assert body["field"] == "/name"
    missing = corpus_request(_cid())
    del missing["name"]
    assert assert_error(api.post("/v0/corpora", json=missing), 422, "invalid_schema")["field"] == "/name"
    no_key = corpus_request(_cid())
    del no_key["idempotency_key"]
    assert assert_error(api.post("/v0/corpora", json=no_key), 422, "invalid_schema")["field"] == "/idempotency_key"
    body = assert_error(api.post("/v0/corpora", json=corpus_request(_cid(), colour="red")), 422, "invalid_schema")
    assert body["field"] == "/colour"
    assert_error(api.post("/v0/corpora", content=b"[]"), 400, "malformed_json")


def test_unsupported_plugin_profile(api):
    corpus_id = _cid()
    key = uuid.uuid4().hex
    retrieval = {"plugin_profile": "no_such_profile",
                 "fields": [{"name": "body", "source_pointer": "/manifest/text", "type": "string",
                             "roles": ["search"]}]}
    # part1 Errors 422 unsupported_profile.
    body = assert_error(api.post("/v0/corpora", json=corpus_request(corpus_id, key=key, retrieval=retrieval)),
                        422, "unsupported_profile")
    assert body["field"] == "/retrieval/plugin_profile"
    # Nothing was created and the key was not claimed.
    assert_error(api.get(f"/v0/corpora/{corpus_id}"), 404, "not_found")
    r = api.post("/v0/corpora", json=corpus_request(corpus_id, key=key))
    assert r.status_code == 201, r.text


def test_list_corpora_paging_and_scope(server, make_key, org, api):
    ids = sorted(f"p{i}-{uuid.uuid4().hex[:6]}" for i in range(5))
    for corpus_id in ids:
        create_corpus(api, corpus_id)
    # part1 rule 14 + Conventions: pages in id order; next_page_cursor only while more remain.
    pages = list_pages(api, 2)
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [c["corpus_id"] for p in pages for c in p] == ids
    assert [len(p) for p in list_pages(api, 5)] == [5]
    assert [len(p) for p in list_pages(api)] == [5]
    for corpus in pages[0]:
        assert set(corpus) == {"corpus_id", "name", "created_at", "retrieval", "projection_generation_id",
                               "vector_spaces"}

    # part1 rule 14: authorized Corpora only.
    scope = [ids[0], ids[2], "not-created-yet"]
    with client_for(server, make_key(org, "corpora:read", ",".join(scope))) as scoped:
        assert [c["corpus_id"] for p in list_pages(scoped, 1) for c in p] == [ids[0], ids[2]]
        # part1 rule 14: the page cursor is bound to the scope.
        cursor = api.get("/v0/corpora", params={"limit": 1}).json()["next_page_cursor"]
        body = assert_error(scoped.get("/v0/corpora", params={"page_cursor": cursor}), 409, "cursor_scope_changed")
        assert body["resync_url"]
        # Authentication 3: a Corpus outside the scope is 404 by id (decisions.md Resolved ambiguities).
        assert_error(scoped.get(f"/v0/corpora/{ids[1]}"), 404, "not_found")
        assert scoped.get(f"/v0/corpora/{ids[0]}").status_code == 200
        # Creating a Corpus outside the key's scope is refused.
        assert_error(scoped.post("/v0/corpora", json=corpus_request(_cid())), 403, "forbidden")
    # A key with the same scope may continue the same traversal.
    with client_for(server, make_key(org)) as same_scope:
        cursor = api.get("/v0/corpora", params={"limit": 2}).json()["next_page_cursor"]
        r = same_scope.get("/v0/corpora", params={"page_cursor": cursor, "limit": 2})
        assert r.status_code == 200 and [c["corpus_id"] for c in r.json()["items"]] == ids[2:4]

    # part1 rule 14: a change cursor or a record page cursor here is 422 invalid_cursor.
    change_cursor = api.get("/v0/changes", params={"corpus_id": ids[0]}).json()["next_cursor"]
    body = assert_error(api.get("/v0/corpora", params={"page_cursor": change_cursor}), 422, "invalid_cursor")
    assert body["field"] == "/page_cursor"
    assert_error(api.get("/v0/corpora", params={"page_cursor": "garbage"}), 422, "invalid_cursor")
    # decisions.md Errors: malformed query parameters are 422 invalid_input with field /limit.
    for bad in ("0", "101", "x"):
        body = assert_error(api.get("/v0/corpora", params={"limit": bad}), 422, "invalid_input")
        assert body["field"] == "/limit"


def test_record_page_cursor_is_not_a_corpus_cursor(api):
    corpus = create_corpus(api, _cid())
    for i in range(2):
        r = api.post("/v0/records/withdrawals", json={
            "idempotency_key": uuid.uuid4().hex,
            "source": {"corpus_id": corpus, "namespace": "n", "record_key": f"r{i}"}})
        assert r.status_code == 202
    # Wait until both Records are listed, then take a record page cursor.
    deadline = time.time() + 20
    while True:
        page = api.get("/v0/records", params={"corpus_id": corpus, "limit": 1}).json()
        if "next_page_cursor" in page:
            break
        assert time.time() < deadline
        time.sleep(0.05)
    # part1 rule 14: a record page cursor passed to listCorpora is 422 invalid_cursor.
    assert_error(api.get("/v0/corpora", params={"page_cursor": page["next_page_cursor"]}), 422, "invalid_cursor")


def test_get_corpus_not_found_cases(server, make_key, org, api):
    corpus_id = _cid()
    create_corpus(api, corpus_id)
    assert_error(api.get("/v0/corpora/does-not-exist"), 404, "not_found")
    # Authentication 3: another Organization's Corpus is 404, never 403.
    with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as stranger:
        assert_error(stranger.get(f"/v0/corpora/{corpus_id}"), 404, "not_found")
        assert corpus_id not in [c["corpus_id"] for c in stranger.get("/v0/corpora").json()["items"]]
        # The same id is free in another Organization.
        assert stranger.post("/v0/corpora", json=corpus_request(corpus_id)).status_code == 201
    # Authentication 3: actions are checked.
    with client_for(server, make_key(org, "content:read")) as no_corpora:
        assert_error(no_corpora.get(f"/v0/corpora/{corpus_id}"), 403, "forbidden")
        assert_error(no_corpora.get("/v0/corpora"), 403, "forbidden")
        assert_error(no_corpora.post("/v0/corpora", json=corpus_request(_cid())), 403, "forbidden")


def test_concurrent_creators_of_one_corpus_id(server, make_key, org):
    from concurrent.futures import ThreadPoolExecutor

    secret = make_key(org)
    corpus_id = _cid()
    shared_key = uuid.uuid4().hex

    def send(i):
        # Half replay one request under one key; the other half are different requests for the same id.
        body = corpus_request(corpus_id, name="Raced", key=shared_key if i % 2 else None)
        with client_for(server, secret) as c:
            return i, c.post("/v0/corpora", json=body)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, range(12)))
    statuses = [r.status_code for _, r in results]
    # part1 rule 13 + decisions.md Corpora: exactly one creation (201). If a shared-key request won, the
    # other shared-key requests replay it (200) and every different request is 409 corpus_exists; if a
    # different request won, everything else is 409 corpus_exists.
    assert statuses.count(201) == 1, statuses
    [winner] = [i for i, r in results if r.status_code == 201]
    for i, r in results:
        if i == winner:
            continue
        if winner % 2 and i % 2:
            assert r.status_code == 200, r.text
            assert r.json() == results[winner][1].json()
        else:
            assert_error(r, 409, "corpus_exists")


def test_every_cursor_error_names_the_record_catalog(server, make_key, org, api):
    # part1 rule 6: the Record catalog route (relative) is the resync_url of change-feed and catalog
    # cursor errors; rule 18: for a Corpus, `/v0/records?corpus_id=<corpus_id>`. A corpora page
    # cursor binds no Corpus, so it names the route itself (docs/decisions.md, Cursors).
    corpora = [create_corpus(api) for _ in range(2)]
    narrower = make_key(org, "corpora:read,content:read,changes:read", corpora[0])
    corpus_cursor = api.get("/v0/corpora", params={"limit": 1}).json()["next_page_cursor"]
    for i in range(2):
        assert api.post("/v0/records", json={
            "idempotency_key": uuid.uuid4().hex, "source": {"corpus_id": corpora[0], "namespace": "n",
                                                            "record_key": f"k{i}"},
            "content": {"kind": "text", "text": f"text {i}"}}).status_code == 202
    deadline = time.time() + 30
    while len(api.get("/v0/records", params={"corpus_id": corpora[0]}).json()["items"]) < 2:
        assert time.time() < deadline, "records not listed"
        time.sleep(0.05)
    record_cursor = api.get("/v0/records", params={"corpus_id": corpora[0], "limit": 1}).json()["next_page_cursor"]
    change_cursor = api.get("/v0/changes", params={"corpus_id": corpora[0]}).json()["next_cursor"]

    with client_for(server, narrower) as scoped:
        body = assert_error(scoped.get("/v0/corpora", params={"page_cursor": corpus_cursor}),
                            409, "cursor_scope_changed")
        assert body["resync_url"] == "/v0/records"
        body = assert_error(scoped.get("/v0/records", params={"corpus_id": corpora[0], "page_cursor": record_cursor}),
                            409, "cursor_scope_changed")
        assert body["resync_url"] == f"/v0/records?corpus_id={corpora[0]}"
        body = assert_error(scoped.get("/v0/changes", params={"corpus_id": corpora[0], "cursor": change_cursor}),
                            409, "cursor_scope_changed")
        assert body["resync_url"] == f"/v0/records?corpus_id={corpora[0]}"
    # The Corpus a resync_url names is the request's, never the cursor's.
    body = assert_error(api.get("/v0/changes", params={"corpus_id": corpora[1], "cursor": change_cursor}),
                        409, "cursor_scope_changed")
    assert body["resync_url"] == f"/v0/records?corpus_id={corpora[1]}"
