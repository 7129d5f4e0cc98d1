"""Authentication, authorization and the Error envelope over real HTTP.

Covers part 1 "Authentication", "Errors", "Limits", the Error object, and
decisions.md "Errors" and "Resolved ambiguities" (scope: 403 for a named
Corpus, 404 for a resource looked up by its own id).
"""

from __future__ import annotations

import time
import uuid

import httpx
import psycopg
import pytest

from contentsvc.auth import keys
from tests.conftest import assert_error, client_for, create_corpus, text_command, wait_current, wait_resolved

MiB = 1024 * 1024


def _cid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_key_with_id(database_url: str, org: str, actions: str = "*", corpora: str = "*") -> keys.CreatedKey:
    with psycopg.connect(database_url, autocommit=True) as conn:
        return keys.create_key(conn, org, keys.parse_actions(actions), keys.parse_corpora(corpora), "e2e")


def revoke(database_url: str, key_id: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert keys.revoke_key(conn, key_id)


@pytest.fixture
def bare(server):
    """A client that sends no Authorization header."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def _resources(api) -> dict:
    """A Corpus with one resolved Record: the ids other callers will try to reach."""
    corpus = create_corpus(api, _cid())
    receipt = wait_current(api, wait_resolved(api, api.post("/v0/records", json=text_command(
        corpus, "doc", "secret text")).json()["receipt_id"]))
    return {"corpus": corpus, "record_id": receipt["record_id"], "version_id": receipt["version_id"],
            "receipt_id": receipt["receipt_id"]}


def _lookups(res: dict) -> list[str]:
    return [
        f"/v0/records/{res['record_id']}",
        f"/v0/records/{res['record_id']}/versions/{res['version_id']}",
        f"/v0/ingestion-receipts/{res['receipt_id']}",
    ]


# ----------------------------------------------------------------- authentication


def test_missing_and_unknown_keys_are_401(server, bare, api):
    corpus = create_corpus(api, _cid())
    requests = [
        ("GET", f"/v0/records?corpus_id={corpus}", None),
        ("POST", "/v0/records", text_command(corpus, "a", "x")),
        ("POST", "/v0/records/batch", {"entries": []}),
        ("POST", "/v0/records/withdrawals", {"idempotency_key": "k", "source": {"corpus_id": corpus,
                                                                            "namespace": "n", "record_key": "r"}}),
        ("GET", "/v0/records/rec_x", None),
        ("GET", "/v0/ingestion-receipts/rcp_x", None),
        ("GET", "/v0/corpora", None),
        ("POST", "/v0/corpora", {"idempotency_key": "k", "name": "n"}),
        ("GET", f"/v0/corpora/{corpus}", None),
        ("GET", f"/v0/changes?corpus_id={corpus}", None),
        ("GET", f"/v0/changes/stream?corpus_id={corpus}", None),
    ]
    headers_variants = [
        {},  # no key
        {"Authorization": "Bearer csk_" + "A" * 43},  # unknown key
        {"Authorization": "Bearer"},  # no secret
        {"Authorization": "Basic dXNlcjpwYXNz"},  # another scheme
        {"Authorization": "csk_" + "A" * 43},  # no scheme
    ]
    # Authentication 1 and 3: every endpoint requires the key; missing or unknown -> 401 invalid_api_key.
    for method, path, body in requests:
        for headers in headers_variants:
            r = bare.request(method, path, json=body, headers=headers)
            assert_error(r, 401, "invalid_api_key")
    # decisions.md Operator: /v0/health needs no key.
    r = bare.get("/v0/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_revoked_key_is_401_on_next_request(server, database_url, org, api):
    corpus = create_corpus(api, _cid())
    created = create_key_with_id(database_url, org)
    with client_for(server, created.secret) as client:
        assert client.get("/v0/records", params={"corpus_id": corpus}).status_code == 200
        revoke(database_url, created.key_id)
        # decisions.md Operator: `keys revoke` takes effect on the next request.
        assert_error(client.get("/v0/records", params={"corpus_id": corpus}), 401, "invalid_api_key")
        assert_error(client.post("/v0/records", json=text_command(corpus, "a", "x")), 401, "invalid_api_key")
    # Other keys of the Organization are unaffected.
    assert api.get("/v0/records", params={"corpus_id": corpus}).status_code == 200


def test_cached_keys_still_honour_revocation_and_changes_on_the_next_request(server, database_url, org, api):
    # decisions.md (spec) Operator: `keys revoke` takes effect on the next request, with the API's key
    # cache (docs/decisions.md Keys): each key is used (so cached), then revoked from another connection.
    corpus = create_corpus(api, _cid())
    for _ in range(10):
        created = create_key_with_id(database_url, org)
        with client_for(server, created.secret) as client:
            for _ in range(3):
                assert client.get("/v0/records", params={"corpus_id": corpus}).status_code == 200
            revoke(database_url, created.key_id)
            assert_error(client.get("/v0/records", params={"corpus_id": corpus}), 401, "invalid_api_key")
    created = create_key_with_id(database_url, org)
    with client_for(server, created.secret) as client:
        assert client.get("/v0/records", params={"corpus_id": corpus}).status_code == 200
        # A change made in plain SQL is announced by the trigger too (no wait for it here: within 2 s).
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("UPDATE api_keys SET actions = ARRAY['search:query'] WHERE key_id = %s", (created.key_id,))
        deadline = time.monotonic() + 2
        while (r := client.get("/v0/records", params={"corpus_id": corpus})).status_code == 200:
            assert time.monotonic() < deadline, "the narrowed key was still served from the cache"
            time.sleep(0.01)
        assert_error(r, 403, "forbidden")


def test_missing_action_is_403(server, make_key, org, api):
    res = _resources(api)
    corpus = res["corpus"]
    # Authentication 3: action outside the key's scope -> 403 forbidden.
    with client_for(server, make_key(org, "content:read")) as reader:
        assert_error(reader.post("/v0/records", json=text_command(corpus, "a", "x")), 403, "forbidden")
        assert_error(reader.post("/v0/records/batch", json={"entries": [text_command(corpus, "a", "x")]}),
                     403, "forbidden")
        assert_error(reader.post("/v0/records/withdrawals",
                                 json={"idempotency_key": "k", "source": {"corpus_id": corpus, "namespace": "test",
                                                                          "record_key": "doc"}}), 403, "forbidden")
        assert_error(reader.get("/v0/changes", params={"corpus_id": corpus}), 403, "forbidden")
        assert_error(reader.get("/v0/changes/stream", params={"corpus_id": corpus}), 403, "forbidden")
        for path in _lookups(res):
            assert reader.get(path).status_code == 200
    with client_for(server, make_key(org, "content:write")) as writer:
        for path in _lookups(res):
            assert_error(writer.get(path), 403, "forbidden")
        assert_error(writer.get("/v0/records", params={"corpus_id": corpus}), 403, "forbidden")
    # The withdrawal was refused: the Record is not withdrawn.
    assert api.get(f"/v0/records/{res['record_id']}").json()["withdrawn"] is False


def test_corpus_scope(server, make_key, org, api):
    res = _resources(api)
    inside = create_corpus(api, _cid("in"))
    with client_for(server, make_key(org, "*", inside)) as scoped:
        # decisions.md Resolved ambiguities: a Corpus named in a request outside the scope is 403.
        assert_error(scoped.post("/v0/records", json=text_command(res["corpus"], "n", "x")), 403, "forbidden")
        assert_error(scoped.post("/v0/records/withdrawals", json={
            "idempotency_key": "k", "source": {"corpus_id": res["corpus"], "namespace": "test", "record_key": "doc"}}),
            403, "forbidden")
        assert_error(scoped.get("/v0/records", params={"corpus_id": res["corpus"]}), 403, "forbidden")
        assert_error(scoped.get("/v0/changes", params={"corpus_id": res["corpus"]}), 403, "forbidden")
        # part1 rule 2: a batch entry outside the scope gets its own 403, the others go through.
        r = scoped.post("/v0/records/batch", json={"entries": [text_command(res["corpus"], "n", "x"),
                                                               text_command(inside, "n", "x")]})
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert [i["status"] for i in items] == [403, 202]
        assert items[0]["error"]["code"] == "forbidden"
        # decisions.md Resolved ambiguities: a resource looked up by its own id outside the scope is 404.
        for path in _lookups(res):
            assert_error(scoped.get(path), 404, "not_found")
        assert_error(scoped.get(f"/v0/corpora/{res['corpus']}"), 404, "not_found")
        # Inside the scope all is well.
        assert scoped.post("/v0/records", json=text_command(inside, "m", "y")).status_code == 202
    # The withdrawal was refused: the Record is not withdrawn.
    assert api.get(f"/v0/records/{res['record_id']}").json()["withdrawn"] is False


def test_other_organization_is_404_never_403(server, make_key, api):
    res = _resources(api)
    with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as stranger:
        # Authentication 3: a resource of another Organization is 404, never 403.
        for path in _lookups(res):
            assert_error(stranger.get(path), 404, "not_found")
        assert_error(stranger.get(f"/v0/corpora/{res['corpus']}"), 404, "not_found")
        assert_error(stranger.get("/v0/records", params={"corpus_id": res["corpus"]}), 404, "not_found")
        assert_error(stranger.get("/v0/changes", params={"corpus_id": res["corpus"]}), 404, "not_found")
        assert_error(stranger.get("/v0/changes/stream", params={"corpus_id": res["corpus"]}), 404, "not_found")
        assert_error(stranger.post("/v0/records", json=text_command(res["corpus"], "doc", "x")), 404, "not_found")
        assert_error(stranger.post("/v0/records/withdrawals", json={
            "idempotency_key": "k", "source": {"corpus_id": res["corpus"], "namespace": "test", "record_key": "doc"}}),
            404, "not_found")
    # Nothing of the stranger's reached the Record.
    record = api.get(f"/v0/records/{res['record_id']}").json()
    assert record["withdrawn"] is False and record["current_version_id"] == res["version_id"]


# ----------------------------------------------------------------- error envelope


def test_unknown_route_and_wrong_method(api, bare):
    # decisions.md Errors: 404 for an unknown route and 405 are the Error object too.
    for client in (api, bare):
        for method, path in [("GET", "/v0/nope"), ("GET", "/nope"), ("POST", "/v0/records/x/y/z"),
                             ("GET", "/v0/records/r/versions")]:
            assert_error(client.request(method, path), 404, "not_found")
    for method, path in [("DELETE", "/v0/records"), ("PUT", "/v0/corpora"), ("POST", "/v0/changes"),
                         ("PATCH", "/v0/records/rec_x"), ("DELETE", "/v0/health")]:
        body = assert_error(api.request(method, path), 405, "method_not_allowed")
        assert "field" not in body


@pytest.mark.parametrize("raw", [
    b"not json",
    b"",
    b"{",
    b'{"idempotency_key": "k",',
    b'{"colour": 1,,,}',  # a schema fault before the syntax error is still malformed JSON
    b'{"idempotency_key": 5 garbage}',
    b"\xff\xfe",
])
def test_malformed_json_is_400(api, raw):
    # part1 Errors 400 + decisions.md Resolved ambiguities: a body that is not JSON is 400 malformed_json.
    for path in ("/v0/records", "/v0/records/withdrawals", "/v0/records/batch", "/v0/corpora"):
        r = api.post(path, content=raw, headers={"content-type": "application/json"})
        assert_error(r, 400, "malformed_json")


def test_non_object_top_level_is_400(api):
    # decisions.md Resolved ambiguities: a top level that is not an object is 400 malformed_json.
    for raw in (b"[]", b'[{"idempotency_key": "k"}]', b'"text"', b"42", b"null", b"true"):
        for path in ("/v0/records", "/v0/records/withdrawals", "/v0/records/batch", "/v0/corpora"):
            assert_error(api.post(path, content=raw), 400, "malformed_json")


def test_schema_faults_are_422_with_pointer(api):
    corpus = create_corpus(api, _cid())
    good = text_command(corpus, "doc", "x")

    def fault(body, path="/v0/records"):
        return assert_error(api.post(path, json=body), 422, "invalid_schema")["field"]

    # decisions.md Records: unknown members are 422 invalid_schema with field pointing at the first one.
    assert fault(dict(good, colour="red")) == "/colour"
    assert fault(dict(good, source=dict(good["source"], colour="red"))) == "/source/colour"
    assert fault(dict(good, content={"kind": "text", "text": "x", "colour": "red"})) == "/content/colour"
    # decisions.md Resolved ambiguities: missing member, wrong type, out-of-range value.
    missing = dict(good)
    del missing["content"]
    assert fault(missing) == "/content"
    assert fault(dict(good, source={"corpus_id": corpus, "namespace": "n"})) == "/source/record_key"
    assert fault(dict(good, content={"kind": "text", "text": 5})) == "/content/text"
    assert fault(dict(good, content={"kind": "text", "text": ""})) == "/content/text"
    assert fault(dict(good, idempotency_key="")) == "/idempotency_key"
    assert fault(dict(good, content={"kind": "video", "text": "x"})) == "/content/kind"
    assert fault(dict(good, relations=[{"relation": "Bad-Name", "target": good["source"]}])) == \
        "/relations/0/relation"
    assert fault(dict(good, relations=[{"relation": "cites", "target": good["source"]}] * 65)) == "/relations"
    assert fault(dict(good, provenance={"origin": "robot"})) == "/provenance/origin"
    parts = [{"key": "a", "role": "body", "content": {"kind": "text", "text": "x"}},
             {"key": "a", "role": "body", "content": {"kind": "text", "text": "y"}}]
    assert fault(dict(good, content={"kind": "manifest", "parts": parts})) == "/content/parts/1/key"
    assert fault(dict(good, content={"kind": "manifest", "parts": []})) == "/content/parts"
    # Withdrawals have the same rules.
    assert fault({"idempotency_key": "k", "source": good["source"], "colour": 1}, "/v0/records/withdrawals") == \
        "/colour"


def test_body_over_one_mib_is_413(api):
    corpus = create_corpus(api, _cid())
    big = text_command(corpus, "big", "x" * (MiB + 1))
    # part1 Limits: one ingest command at most 1 MiB -> 413 request_too_large.
    for path, body in [("/v0/records", big),
                       ("/v0/records/withdrawals", {"idempotency_key": "k", "source": big["source"],
                                                    "reason": "r" * (MiB + 1)}),
                       ("/v0/corpora", {"idempotency_key": "k", "name": "n", "pad": "x" * (MiB + 1)})]:
        assert_error(api.post(path, json=body), 413, "request_too_large")

    # Without a Content-Length (chunked transfer) the bound holds as well.
    raw = httpx.Request("POST", "/", json=big).content

    def chunks():
        for i in range(0, len(raw), 64 * 1024):
            yield raw[i:i + 64 * 1024]

    assert_error(api.post("/v0/records", content=chunks(), headers={"content-type": "application/json"}),
                 413, "request_too_large")
    # Just under the bound is accepted.
    fits = text_command(corpus, "fits", "x" * (MiB - 1024))
    assert api.post("/v0/records", json=fits).status_code == 202


def test_error_bodies_never_leak_internals(api):
    # part1 Error: no additional properties; decisions.md Errors: application/json, no stack trace.
    r = api.get("/v0/records/" + "x" * 5000)
    body = assert_error(r, 404, "not_found")
    assert "x" * 100 not in body["message"]
    r = api.get("/v0/records", params={"corpus_id": "c", "limit": "9" * 400})
    assert_error(r, 422, "invalid_input")
