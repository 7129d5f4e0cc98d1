"""Bad input answers with the Error envelope, never a 500 or a storage error, over real HTTP.

decisions.md "Errors": a body that is not JSON is 400 `malformed_json`; a member that breaks
the schema is 422 `invalid_schema` with a JSON Pointer `field`. PostgreSQL cannot store
U+0000 in text, so a string holding it is refused at decoding, wherever it stands; a body
that is not UTF-8, or that nests deeper than the service walks, is not JSON it accepts.
"""

from __future__ import annotations

import uuid

from tests.conftest import assert_error, create_corpus, text_command

DEEP = 1000  # far beyond the service's nesting bound, and beyond Python's recursion limit


def _cid() -> str:
    return f"bad-{uuid.uuid4().hex[:10]}"


def test_a_nul_in_any_string_is_invalid_schema_at_its_member(api):
    # decisions.md Errors: 422 invalid_schema with `field`, never 500 or 503 storage_unavailable.
    corpus = create_corpus(api, _cid())
    cases = [
        ("/v0/corpora", {"idempotency_key": "k", "corpus_id": "c\u0000", "name": "n"}, "/corpus_id"),
        ("/v0/corpora", {"idempotency_key": "k", "corpus_id": _cid(), "name": "n\u0000"}, "/name"),
        ("/v0/records", text_command(corpus, "r\u0000", "text"), "/source/record_key"),
        ("/v0/records", text_command(corpus, "r", "te\u0000xt"), "/content/text"),
        ("/v0/records", {**text_command(corpus, "r", "text"), "idempotency_key": "k\u0000"}, "/idempotency_key"),
        ("/v0/search", {"query": "hello\u0000", "corpus_ids": [corpus], "mode": "lexical"}, "/query"),
        ("/v0/search", {"query": "hello", "corpus_ids": [corpus],
                        "filter": {"source_namespaces": ["n\u0000"]}}, "/filter/source_namespaces/0"),
    ]
    for path, body, field in cases:
        error = assert_error(api.post(path, json=body), 422, "invalid_schema")
        assert error["field"] == field, (path, error)


def test_a_nul_in_a_batch_entry_is_that_entrys_error(api):
    # part 1 rule 2: each batch entry is validated on its own; the others are accepted.
    corpus = create_corpus(api, _cid())
    r = api.post("/v0/records/batch", json={"entries": [
        text_command(corpus, "fine", "a good entry"),
        text_command(corpus, "bad", "a bad \u0000 entry"),
    ]})
    assert r.status_code == 200, r.text
    first, second = r.json()["items"]
    assert first["receipt"]["state"] in ("pending", "resolved")
    assert second["error"]["code"] == "invalid_schema"
    assert second["error"]["field"] == "/entries/1/content/text"


def test_a_nul_in_a_query_parameter_or_a_path_id_is_refused(api):
    # decisions.md Errors: query faults are 422 invalid_input naming the parameter; an id
    # holding U+0000 names nothing (404), never a storage error.
    assert_error(api.get("/v0/records", params={"corpus_id": "c\u0000"}), 422, "invalid_input")
    assert_error(api.get("/v0/changes", params={"corpus_id": "c\u0000"}), 422, "invalid_input")
    assert_error(api.get("/v0/records/rec_%00"), 404, "not_found")
    assert_error(api.get("/v0/corpora/c%00"), 404, "not_found")


def test_a_body_that_is_not_utf8_is_malformed_json(api):
    # decisions.md Errors: 400 malformed_json, never 500.
    raw = b'{"idempotency_key":"\xff\xfe","corpus_id":"c","name":"n"}'
    assert_error(api.post("/v0/corpora", content=raw, headers={"content-type": "application/json"}),
                 400, "malformed_json")


def test_json_nested_beyond_the_bound_is_malformed_json_before_it_is_parsed(api):
    # decisions.md Errors: 400 malformed_json with a bounded depth, never a RecursionError (500).
    corpus = create_corpus(api, _cid())
    command = text_command(corpus, "deep", "text")
    body = ('{"idempotency_key":"deep","source":{"corpus_id":"%s","namespace":"n","record_key":"deep"},'
            '"content":{"kind":"text","text":"t"},"provenance":{"x":%s%s}}' % (corpus, "[" * DEEP, "]" * DEEP))
    for path, raw in (("/v0/records", body), ("/v0/records/batch", '{"entries":[%s]}' % body)):
        assert_error(api.post(path, content=raw.encode(), headers={"content-type": "application/json"}),
                     400, "malformed_json")
    # Brackets inside strings are text, not nesting.
    shallow = {**command, "content": {"kind": "text", "text": "[" * DEEP}}
    assert api.post("/v0/records", json=shallow).status_code == 202
