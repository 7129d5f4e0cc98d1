"""Records over real HTTP against a real `contentsvc run` process.

Covers part 1 rules 1-6 (ingest, batch, withdrawal, getVersion, getReceipt,
listRecords), the Conventions on idempotency and paging, the Limits, and
decisions.md "Records".
"""

from __future__ import annotations

import base64
import json
import uuid

import httpx

from tests.conftest import assert_error, client_for, create_corpus, text_command, wait_current, wait_resolved
from tests.e2e.test_uploads import blob_command, verified_blob

MiB = 1024 * 1024


# ----------------------------------------------------------------- helpers


def _cid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ingest(client: httpx.Client, cmd: dict) -> dict:
    r = client.post("/v0/records", json=cmd)
    assert r.status_code == 202, r.text
    return r.json()


def withdrawal(corpus_id: str, record_key: str, key: str | None = None, **extra) -> dict:
    return {
        "idempotency_key": key or uuid.uuid4().hex,
        "source": {"corpus_id": corpus_id, "namespace": "test", "record_key": record_key},
        **extra,
    }


def withdraw(client: httpx.Client, cmd: dict) -> dict:
    r = client.post("/v0/records/withdrawals", json=cmd)
    assert r.status_code == 202, r.text
    return r.json()


def ingest_resolved(client: httpx.Client, corpus_id: str, record_key: str, text: str, **extra) -> dict:
    """Resolved, and for a new Version, once it is current (it serves from then on)."""
    resolved = wait_resolved(client, ingest(client, text_command(corpus_id, record_key, text, **extra))["receipt_id"])
    if resolved["outcome"] == "created" and resolved["availability"]["state"] != "quarantined":
        return wait_current(client, resolved)
    return resolved


def get_record(client: httpx.Client, record_id: str) -> dict:
    r = client.get(f"/v0/records/{record_id}")
    assert r.status_code == 200, r.text
    return r.json()


def get_version(client: httpx.Client, record_id: str, version_id: str) -> dict:
    r = client.get(f"/v0/records/{record_id}/versions/{version_id}")
    assert r.status_code == 200, r.text
    return r.json()


def body_text(version: dict, key: str = "body") -> str:
    [part] = [p for p in version["manifest"]["parts"] if p["key"] == key]
    return part["content"]["text"]


def assert_receipt_shape(receipt: dict) -> None:
    # part1 "Receipt": required members, outcome only when resolved, at most 20 diagnostics.
    assert set(receipt) <= {"receipt_id", "state", "outcome", "record_id", "version_id", "availability",
                            "diagnostics", "source", "processing"}, receipt
    assert {"receipt_id", "state", "diagnostics", "source", "processing"} <= set(receipt)
    assert receipt["receipt_id"].startswith("rcp_")
    assert receipt["state"] in ("pending", "resolved")
    if receipt["state"] == "pending":
        assert "outcome" not in receipt
    else:
        assert receipt["outcome"] in ("created", "duplicate", "withdrawal_applied", "conflict")
    assert isinstance(receipt["diagnostics"], list) and len(receipt["diagnostics"]) <= 20
    assert set(receipt["source"]) == {"corpus_id", "namespace", "record_key"}
    assert receipt["processing"]["state"] in ("queued", "running", "retrying", "blocked", "idle")
    if "availability" in receipt:
        assert set(receipt["availability"]) == {"state", "is_current", "searchable"}


def _b64d(token: str) -> bytes:
    return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))


def tamper(token: str, **changes) -> str:
    """Rewrites a cursor's payload but keeps the old HMAC tag (a forged cursor)."""
    raw = _b64d(token)
    payload = json.loads(raw[:-16])
    payload.update(changes)
    forged = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode() + raw[-16:]
    return base64.urlsafe_b64encode(forged).rstrip(b"=").decode()


def list_all(client: httpx.Client, corpus_id: str, limit: int) -> list[list[dict]]:
    pages, cursor = [], None
    while True:
        params = {"corpus_id": corpus_id, "limit": limit}
        if cursor:
            params["page_cursor"] = cursor
        r = client.get("/v0/records", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert set(page) <= {"items", "next_page_cursor"}
        pages.append(page["items"])
        cursor = page.get("next_page_cursor")
        if cursor is None:
            return pages
        assert len(pages) < 50


# ----------------------------------------------------------------- ingest


def test_ingest_single_created(api):
    corpus = create_corpus(api, _cid())
    cmd = text_command(corpus, "doc-1", "Hello world", title="Greeting")
    r = api.post("/v0/records", json=cmd)
    # part1 rule 1: 202, Location points at the Receipt.
    assert r.status_code == 202, r.text
    receipt = r.json()
    assert_receipt_shape(receipt)
    assert r.headers["location"] == f"/v0/ingestion-receipts/{receipt['receipt_id']}"
    assert receipt["source"] == cmd["source"]
    # part1 "Receipt": a fresh acceptance is pending and has no outcome yet.
    assert receipt["state"] == "pending" and "outcome" not in receipt

    # part1 rule 5: the Location is readable at once.
    r2 = api.get(r.headers["location"])
    assert r2.status_code == 200, r2.text
    assert r2.json()["receipt_id"] == receipt["receipt_id"]

    resolved = wait_resolved(api, receipt["receipt_id"])
    assert_receipt_shape(resolved)
    assert resolved["outcome"] == "created"
    assert resolved["record_id"].startswith("rec_") and resolved["version_id"].startswith("ver_")
    # materialized at resolution; the lexical projector may already have moved it on
    assert resolved["availability"]["state"] in ("materialized", "building_baseline", "retrieval_ready")
    # part1 "States and transitions": a Version still building reports is_current false until it
    # becomes current, which it does when it can serve.
    assert resolved["availability"]["is_current"] is (resolved["availability"]["state"] == "retrieval_ready")
    assert resolved["diagnostics"] == []
    resolved = wait_current(api, resolved)
    assert resolved["availability"] == {"state": "retrieval_ready", "is_current": True, "searchable": True}

    # part1 "Record and Version read views".
    record = get_record(api, resolved["record_id"])
    assert record == {"record_id": resolved["record_id"], "source": cmd["source"],
                      "current_version_id": resolved["version_id"], "withdrawn": False}
    version = get_version(api, resolved["record_id"], resolved["version_id"])
    assert version["version_id"] == resolved["version_id"]
    assert version["record_id"] == resolved["record_id"]
    assert version["source"] == cmd["source"]
    assert version["availability"]["is_current"] is True
    assert version["relations"] == [] and version["diagnostics"] == []
    assert {"processing", "created_at", "accepted_at", "provenance"} <= set(version)
    # decisions.md Records: provenance origin filled by the service, with accepted_at.
    assert version["provenance"]["origin"] == "client" and "accepted_at" in version["provenance"]
    # decisions.md Records: TextContent -> Part body; a title adds a first Part "title".
    assert version["manifest"]["parts"] == [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": "Greeting"}},
        {"key": "body", "role": "body", "content": {"kind": "text", "text": "Hello world"}},
    ]


def test_duplicate_after_nfc_links_existing_version(api):
    corpus = create_corpus(api, _cid())
    first = ingest_resolved(api, corpus, "cafe", "Cafe\u0301 au lait")  # decomposed e + combining acute
    assert first["outcome"] == "created"
    # decisions.md Records: same identity, text equal after NFC -> duplicate, links the existing Version.
    dup = ingest_resolved(api, corpus, "cafe", "Caf\u00e9 au lait")  # precomposed
    assert dup["outcome"] == "duplicate"
    assert dup["receipt_id"] != first["receipt_id"]
    assert dup["record_id"] == first["record_id"]
    assert dup["version_id"] == first["version_id"]
    assert dup["availability"]["is_current"] is True
    assert get_record(api, first["record_id"])["current_version_id"] == first["version_id"]
    # Equal text under another identity is not a duplicate.
    other = ingest_resolved(api, corpus, "cafe-2", "Caf\u00e9 au lait")
    assert other["outcome"] == "created" and other["record_id"] != first["record_id"]


def test_correction_creates_new_version_old_stays_readable(api):
    corpus = create_corpus(api, _cid())
    v1 = ingest_resolved(api, corpus, "doc", "first text")
    v2 = ingest_resolved(api, corpus, "doc", "second text")
    # part1 "What the service does": a new revision under the same identity corrects the Record.
    assert v2["outcome"] == "created"
    assert v2["record_id"] == v1["record_id"]
    assert v2["version_id"] != v1["version_id"]
    record = get_record(api, v1["record_id"])
    assert record["current_version_id"] == v2["version_id"] and record["withdrawn"] is False

    # part1 "Record and Version read views": the old Version stays readable, no longer current.
    old = get_version(api, v1["record_id"], v1["version_id"])
    assert body_text(old) == "first text"
    assert old["availability"]["is_current"] is False
    new = get_version(api, v2["record_id"], v2["version_id"])
    assert body_text(new) == "second text"
    assert new["availability"]["is_current"] is True
    # part1 "States and transitions": the first Receipt's live availability says it was replaced.
    r1 = api.get(f"/v0/ingestion-receipts/{v1['receipt_id']}").json()
    assert r1["outcome"] == "created" and r1["availability"]["is_current"] is False

    # decisions.md Records: duplicate is judged against the *current* Version only.
    v3 = ingest_resolved(api, corpus, "doc", "first text")
    assert v3["outcome"] == "created"
    assert v3["version_id"] not in (v1["version_id"], v2["version_id"])
    assert get_record(api, v1["record_id"])["current_version_id"] == v3["version_id"]


def test_withdrawal_then_ingest_conflicts(api):
    corpus = create_corpus(api, _cid())
    created = ingest_resolved(api, corpus, "doc", "some text")
    r = api.post("/v0/records/withdrawals", json=withdrawal(corpus, "doc", reason="takedown"))
    # part1 rule 3: withdrawal committed before the response, answered with a Receipt.
    assert r.status_code == 202, r.text
    receipt = r.json()
    assert_receipt_shape(receipt)
    assert r.headers["location"] == f"/v0/ingestion-receipts/{receipt['receipt_id']}"
    resolved = wait_resolved(api, receipt["receipt_id"])
    # decisions.md Records: withdrawal Receipt resolves withdrawal_applied.
    assert resolved["outcome"] == "withdrawal_applied"
    assert resolved["record_id"] == created["record_id"]

    record = get_record(api, created["record_id"])
    assert record["withdrawn"] is True  # decisions.md Records
    # decisions.md Records: a withdrawn Record keeps its Versions readable.
    version = get_version(api, created["record_id"], created["version_id"])
    assert body_text(version) == "some text"
    assert version["availability"]["is_current"] is False

    # decisions.md Records: ingest under a withdrawn identity -> conflict, diagnostic record_withdrawn.
    later = ingest_resolved(api, corpus, "doc", "new text after withdrawal")
    assert later["outcome"] == "conflict"
    assert later["record_id"] == created["record_id"]
    assert "version_id" not in later
    codes = [d["code"] for d in later["diagnostics"]]
    assert "record_withdrawn" in codes
    for d in later["diagnostics"]:
        assert {"code", "message", "retryable"} <= set(d)
    record = get_record(api, created["record_id"])
    assert record["withdrawn"] is True and record["current_version_id"] == created["version_id"]

    # part1 "States and transitions": the fence is terminal; another withdrawal still applies.
    again = wait_resolved(api, withdraw(api, withdrawal(corpus, "doc"))["receipt_id"])
    assert again["outcome"] == "withdrawal_applied" and again["record_id"] == created["record_id"]


def test_withdrawal_before_any_ingest(api):
    corpus = create_corpus(api, _cid())
    # part1 "States and transitions": withdrawal accepted any time, even before first materialization.
    resolved = wait_resolved(api, withdraw(api, withdrawal(corpus, "never-ingested"))["receipt_id"])
    assert resolved["outcome"] == "withdrawal_applied"
    record = get_record(api, resolved["record_id"])
    assert record["withdrawn"] is True
    assert record.get("current_version_id") is None
    assert record["source"] == {"corpus_id": corpus, "namespace": "test", "record_key": "never-ingested"}
    later = ingest_resolved(api, corpus, "never-ingested", "too late")
    assert later["outcome"] == "conflict"
    assert [d["code"] for d in later["diagnostics"]] == ["record_withdrawn"]
    # part1 rule 6: withdrawn Records are listed.
    items = api.get("/v0/records", params={"corpus_id": corpus}).json()["items"]
    assert [(i["record_id"], i["withdrawn"]) for i in items] == [(resolved["record_id"], True)]


# ----------------------------------------------------------------- idempotency


def test_idempotent_replay_after_lost_response(api):
    corpus = create_corpus(api, _cid())
    cmd = text_command(corpus, "doc", "replayed text")
    # Conventions + part1 rule 1: the first response is "lost"; the client sends the same request again.
    r1 = api.post("/v0/records", json=cmd)
    r2 = api.post("/v0/records", json=cmd)
    assert r1.status_code == r2.status_code == 202
    assert r1.json()["receipt_id"] == r2.json()["receipt_id"]
    assert r1.headers["location"] == r2.headers["location"]
    resolved = wait_current(api, wait_resolved(api, r1.json()["receipt_id"]))
    # part1 rule 1: replays answer 202 even after the Receipt resolved.
    r3 = api.post("/v0/records", json=dict(reversed(list(cmd.items()))))  # member order is not the request
    assert r3.status_code == 202, r3.text
    assert r3.json()["receipt_id"] == resolved["receipt_id"]
    assert r3.json()["state"] == "resolved" and r3.json()["outcome"] == "created"
    assert r3.json()["version_id"] == resolved["version_id"]
    assert r3.headers["location"] == f"/v0/ingestion-receipts/{resolved['receipt_id']}"
    # Only one Record and one Version exist.
    items = api.get("/v0/records", params={"corpus_id": corpus}).json()["items"]
    assert [i["current_version_id"] for i in items] == [resolved["version_id"]]

    # Conventions: same key, different request -> 409 idempotency_conflict.
    changed = dict(cmd, content={"kind": "text", "text": "other text"})
    assert_error(api.post("/v0/records", json=changed), 409, "idempotency_conflict")
    other_source = dict(cmd, source=dict(cmd["source"], record_key="doc-2"))
    assert_error(api.post("/v0/records", json=other_source), 409, "idempotency_conflict")

    # part1 rule 3: withdrawals have their own idempotency family: the ingest key does not conflict.
    w = withdrawal(corpus, "doc", key=cmd["idempotency_key"])
    w1 = api.post("/v0/records/withdrawals", json=w)
    assert w1.status_code == 202, w1.text
    assert w1.json()["receipt_id"] != resolved["receipt_id"]
    w2 = api.post("/v0/records/withdrawals", json=w)
    assert w2.status_code == 202 and w2.json()["receipt_id"] == w1.json()["receipt_id"]
    assert_error(api.post("/v0/records/withdrawals", json=dict(w, reason="changed")), 409, "idempotency_conflict")
    assert wait_resolved(api, w1.json()["receipt_id"])["outcome"] == "withdrawal_applied"
    # And the ingest family still replays its own Receipt under that key.
    r4 = api.post("/v0/records", json=cmd)
    assert r4.status_code == 202 and r4.json()["receipt_id"] == resolved["receipt_id"]


def test_replay_by_write_only_key_omits_availability(server, make_key, org, api):
    corpus = create_corpus(api, _cid())
    cmd = text_command(corpus, "doc", "write only")
    with client_for(server, make_key(org, "content:write")) as writer:
        receipt = ingest(writer, cmd)
        wait_resolved(api, receipt["receipt_id"])
        # part1 "Receipt" + rule 5: linked availability and diagnostics only with content:read.
        replay = ingest(writer, cmd)
        assert replay["receipt_id"] == receipt["receipt_id"]
        assert replay["state"] == "resolved" and replay["outcome"] == "created"
        assert "availability" not in replay
        assert replay["diagnostics"] == []
        assert_receipt_shape(replay)
        # Authentication 3: reading the Receipt needs content:read.
        assert_error(writer.get(f"/v0/ingestion-receipts/{receipt['receipt_id']}"), 403, "forbidden")


# ----------------------------------------------------------------- batch


def test_batch_mixed_entries_in_order(api):
    corpus = create_corpus(api, _cid())
    good0 = text_command(corpus, "b0", "batch zero")
    missing_field = text_command(corpus, "b1", "x")
    del missing_field["source"]
    wrong_type = text_command(corpus, "b2", "x")
    wrong_type["content"]["text"] = 5
    unknown_member = text_command(corpus, "b4", "x", colour="red")
    too_large = text_command(corpus, "b5", "y" * (MiB + 16))
    good6 = text_command(corpus, "b6", "batch six")
    unknown_corpus = text_command(f"nope-{uuid.uuid4().hex[:6]}", "b7", "x")
    same_as_0 = dict(good0)  # same key, same request: replays entry 0's Receipt
    conflicting = dict(good6, content={"kind": "text", "text": "changed"})  # same key as entry 6, other request
    entries = [good0, missing_field, wrong_type, 42, unknown_member, too_large, good6, unknown_corpus,
               same_as_0, conflicting]
    r = api.post("/v0/records/batch", json={"entries": entries})
    # part1 rule 2: HTTP 200 with a Receipt or an Error per entry, in entry order.
    assert r.status_code == 200, r.text[:2000]
    items = r.json()["items"]
    assert set(r.json()) == {"items"}
    assert [i["index"] for i in items] == list(range(len(entries)))
    assert [i["status"] for i in items] == [202, 422, 422, 422, 422, 413, 202, 404, 202, 409]
    for item in items:
        assert set(item) in ({"index", "status", "receipt"}, {"index", "status", "error"}), item
        if "error" in item:
            err = item["error"]
            assert set(err) <= {"code", "message", "retryable", "field", "resync_url"}
            assert err["message"] and isinstance(err["retryable"], bool)
        else:
            assert_receipt_shape(item["receipt"])

    def err(i):
        return items[i]["error"]

    # decisions.md Errors: missing member / wrong type / non-object / unknown member -> invalid_schema.
    assert err(1)["code"] == "invalid_schema" and err(1)["field"] == "/entries/1/source"
    assert err(2)["code"] == "invalid_schema" and err(2)["field"] == "/entries/2/content/text"
    assert err(3)["code"] == "invalid_schema" and err(3)["field"] == "/entries/3"
    assert err(4)["code"] == "invalid_schema" and err(4)["field"] == "/entries/4/colour"
    # part1 rule 2 + Limits: each raw entry is held to 1 MiB.
    assert err(5)["code"] == "entry_too_large"
    # part1 rule 2: same error codes as single submission.
    assert err(7)["code"] == "not_found"
    assert err(9)["code"] == "idempotency_conflict"
    assert items[8]["receipt"]["receipt_id"] == items[0]["receipt"]["receipt_id"]
    for i in (0, 6):
        assert items[i]["receipt"]["source"] == entries[i]["source"]

    resolved0 = wait_resolved(api, items[0]["receipt"]["receipt_id"])
    resolved6 = wait_resolved(api, items[6]["receipt"]["receipt_id"])
    assert resolved0["outcome"] == resolved6["outcome"] == "created"

    # part1 rule 2: reuse entry keys after an unknown transport outcome -> same Receipts.
    again = api.post("/v0/records/batch", json={"entries": entries})
    assert again.status_code == 200
    items2 = again.json()["items"]
    assert [i["status"] for i in items2] == [202, 422, 422, 422, 422, 413, 202, 404, 202, 409]
    assert items2[0]["receipt"]["receipt_id"] == resolved0["receipt_id"]
    assert items2[0]["receipt"]["state"] == "resolved"
    assert items2[6]["receipt"]["receipt_id"] == resolved6["receipt_id"]
    # part1 rule 2: same idempotency family as single ingest.
    single = api.post("/v0/records", json=good0)
    assert single.status_code == 202 and single.json()["receipt_id"] == resolved0["receipt_id"]
    assert_error(api.post("/v0/records", json=dict(good0, title="t")), 409, "idempotency_conflict")
    # Only the two good entries made Records.
    listed = api.get("/v0/records", params={"corpus_id": corpus}).json()["items"]
    assert sorted(i["record_id"] for i in listed) == sorted([resolved0["record_id"], resolved6["record_id"]])


def test_undeclared_extension_namespaces_are_refused(api):
    # part1 Manifest content: extensions are validated against the installed schema version, so
    # an undeclared namespace is 422 with `field` at it (decisions.md: invalid_schema). The declared
    # one, `example` at schema version "1" (docs/decisions.md, Records), is accepted.
    corpus = create_corpus(api, _cid())
    undeclared = {"undeclared": {"schema_version": "1", "data": {"x": 1}}}
    body = assert_error(api.post("/v0/records", json=text_command(corpus, "u", "text", extensions=undeclared)),
                        422, "invalid_schema")
    assert body["field"] == "/extensions/undeclared"
    later = {"example": {"schema_version": "1", "data": {}}, "a/b": {"schema_version": "1", "data": {}}}
    body = assert_error(api.post("/v0/records", json=text_command(corpus, "u", "text", extensions=later)),
                        422, "invalid_schema")
    assert body["field"] == "/extensions/a~1b"  # the first fault, as an RFC 6901 pointer
    other_version = {"example": {"schema_version": "2", "data": {}}}
    body = assert_error(api.post("/v0/records", json=text_command(corpus, "u", "text", extensions=other_version)),
                        422, "invalid_schema")
    assert body["field"] == "/extensions/example/schema_version"
    in_part = {"idempotency_key": uuid.uuid4().hex,
               "source": {"corpus_id": corpus, "namespace": "test", "record_key": "p"},
               "content": {"kind": "manifest", "parts": [
                   {"key": "body", "role": "body", "content": {"kind": "text", "text": "t"}, "extensions": undeclared}]}}
    body = assert_error(api.post("/v0/records", json=in_part), 422, "invalid_schema")
    assert body["field"] == "/content/parts/0/extensions/undeclared"
    # part1 rule 2: the same error codes per batch entry.
    r = api.post("/v0/records/batch", json={"entries": [text_command(corpus, "b", "t", extensions=undeclared)]})
    assert r.status_code == 200, r.text
    [item] = r.json()["items"]
    assert item["status"] == 422 and item["error"]["code"] == "invalid_schema"
    assert item["error"]["field"] == "/entries/0/extensions/undeclared"
    # Nothing refused was stored; the declared namespace is.
    assert api.get("/v0/records", params={"corpus_id": corpus}).json()["items"] == []
    declared = {"example": {"schema_version": "1", "data": {"summary": "s"}}}
    receipt = ingest_resolved(api, corpus, "ok", "text", extensions=declared)
    assert get_version(api, receipt["record_id"], receipt["version_id"])["extensions"] == declared


def test_batch_envelope_checks(api):
    corpus = create_corpus(api, _cid())
    # decisions.md Errors: an envelope that is not an object is 400; a bad member 422.
    assert_error(api.post("/v0/records/batch", json=[text_command(corpus, "a", "x")]), 400, "malformed_json")
    assert_error(api.post("/v0/records/batch", content=b'{"entries": [1, 2'), 400, "malformed_json")
    assert assert_error(api.post("/v0/records/batch", json={}), 422, "invalid_schema")["field"] == "/entries"
    assert assert_error(api.post("/v0/records/batch", json={"entries": "x"}), 422, "invalid_schema")["field"] == "/entries"
    body = assert_error(api.post("/v0/records/batch", json={"entries": [], "extra": 1}), 422, "invalid_schema")
    assert body["field"] == "/extra"
    r = api.post("/v0/records/batch", json={"entries": []})
    assert r.status_code == 200 and r.json() == {"items": []}


def test_batch_too_many_entries(api):
    corpus = create_corpus(api, _cid())
    entries = [text_command(corpus, f"k{i}", f"text {i}") for i in range(101)]
    # part1 rule 2: more than 100 entries -> 413 batch_too_large, nothing accepted.
    assert_error(api.post("/v0/records/batch", json={"entries": entries}), 413, "batch_too_large")
    # The keys were not claimed: a different request under entry 0's key is accepted.
    r = api.post("/v0/records", json=dict(entries[0], content={"kind": "text", "text": "different"}))
    assert r.status_code == 202, r.text
    # Exactly 100 entries is fine (part1 Limits).
    r = api.post("/v0/records/batch", json={"entries": entries[1:]})
    assert r.status_code == 200, r.text[:500]
    items = r.json()["items"]
    assert len(items) == 100 and all(i["status"] == 202 for i in items)
    assert [i["index"] for i in items] == list(range(100))
    assert len({i["receipt"]["receipt_id"] for i in items}) == 100


def test_batch_envelope_over_10_mib(api):
    corpus = create_corpus(api, _cid())
    entries = [text_command(corpus, f"k{i}", "z" * 1_000_000) for i in range(11)]
    payload = json.dumps({"entries": entries}).encode()
    assert len(payload) > 10 * MiB
    # part1 rule 2 + Limits: envelope over 10 MiB -> 413 request_too_large (checked before entries).
    assert_error(api.post("/v0/records/batch", content=payload,
                          headers={"content-type": "application/json"}), 413, "request_too_large")

    # The same without a Content-Length (chunked): still 413 request_too_large.
    def chunks():
        for i in range(0, len(payload), 256 * 1024):
            yield payload[i:i + 256 * 1024]

    assert_error(api.post("/v0/records/batch", content=chunks(),
                          headers={"content-type": "application/json"}), 413, "request_too_large")
    # Nothing was accepted.
    r = api.post("/v0/records", json=dict(entries[0], content={"kind": "text", "text": "small"}))
    assert r.status_code == 202, r.text


# ----------------------------------------------------------------- getVersion relations


def test_get_version_relation_expansion(server, make_key, org, api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    live = ingest_resolved(api, a, "live", "live target")
    ingest_resolved(api, a, "gone", "to be withdrawn")
    wait_resolved(api, withdraw(api, withdrawal(a, "gone"))["receipt_id"])
    other = ingest_resolved(api, b, "other", "target in another corpus")

    def target(corpus, key):
        return {"corpus_id": corpus, "namespace": "test", "record_key": key}

    relations = [
        {"relation": "cites", "target": target(a, "live")},
        {"relation": "cites", "target": target(a, "missing")},
        {"relation": "replies_to", "target": target(a, "gone")},
        {"relation": "cites", "target": target(b, "other")},
    ]
    src = ingest_resolved(api, a, "src", "source with links", relations=relations)
    assert src["outcome"] == "created"

    def expanded(client):
        return get_version(client, src["record_id"], src["version_id"])["relations"]

    # part1 rule 4: available links give the current target ids; unavailable ones give no ids.
    rels = expanded(api)
    assert [r["relation"] for r in rels] == ["cites", "cites", "replies_to", "cites"]
    assert [r["target_source"] for r in rels] == [r["target"] for r in relations]
    assert rels[0] == {"relation": "cites", "target_source": target(a, "live"), "available": True,
                       "target_record_id": live["record_id"], "target_version_id": live["version_id"]}
    for unavailable in (rels[1], rels[2]):  # absent; withdrawn
        assert unavailable["available"] is False
        assert "target_record_id" not in unavailable and "target_version_id" not in unavailable
    assert rels[3]["available"] is True and rels[3]["target_record_id"] == other["record_id"]

    # part1 rule 4: a target in a Corpus outside the key's scope reads exactly like an absent one.
    with client_for(server, make_key(org, "content:read", a)) as scoped:
        scoped_rels = expanded(scoped)
        assert scoped_rels[0] == rels[0]
        assert scoped_rels[3] == {"relation": "cites", "target_source": target(b, "other"), "available": False}
        assert scoped_rels[1] == {"relation": "cites", "target_source": target(a, "missing"), "available": False}
    # decisions.md Resolved ambiguities: the Version itself, looked up out of scope, is 404.
    with client_for(server, make_key(org, "content:read", b)) as only_b:
        assert_error(only_b.get(f"/v0/records/{src['record_id']}/versions/{src['version_id']}"), 404, "not_found")

    # part1 rule 4: expansion is live: a correction of the target moves target_version_id.
    live2 = ingest_resolved(api, a, "live", "live target, corrected")
    assert expanded(api)[0]["target_version_id"] == live2["version_id"]
    # A target that appears later becomes available.
    appeared = ingest_resolved(api, a, "missing", "now here")
    assert expanded(api)[1]["target_record_id"] == appeared["record_id"]


def test_a_quarantined_target_is_unavailable(api):
    # part1 rule 4: only the current eligible target is available; a quarantined Version serves no
    # one, so a link to a Record whose current Version is quarantined reveals no id.
    corpus = create_corpus(api, _cid())
    blob = verified_blob(api, b"caf\xe9 \xff\xfe not utf-8", "text/plain")
    bad = wait_resolved(api, ingest(api, blob_command(corpus, "bad", blob["blob_id"], "text/plain"))["receipt_id"])
    assert bad["availability"]["state"] == "quarantined"
    good = ingest_resolved(api, corpus, "good", "an eligible target")
    bad_target = {"corpus_id": corpus, "namespace": "uploads", "record_key": "bad"}
    good_target = {"corpus_id": corpus, "namespace": "test", "record_key": "good"}
    src = ingest_resolved(api, corpus, "src", "links to both", relations=[
        {"relation": "cites", "target": bad_target}, {"relation": "cites", "target": good_target}])
    rels = get_version(api, src["record_id"], src["version_id"])["relations"]
    assert rels[0] == {"relation": "cites", "target_source": bad_target, "available": False}
    assert rels[1] == {"relation": "cites", "target_source": good_target, "available": True,
                       "target_record_id": good["record_id"], "target_version_id": good["version_id"]}


def test_get_version_mismatched_ids_404(api):
    corpus = create_corpus(api, _cid())
    one = ingest_resolved(api, corpus, "one", "one")
    two = ingest_resolved(api, corpus, "two", "two")
    # A Version is addressed under its own Record only.
    assert_error(api.get(f"/v0/records/{one['record_id']}/versions/{two['version_id']}"), 404, "not_found")
    assert_error(api.get(f"/v0/records/{one['record_id']}/versions/ver_nope"), 404, "not_found")
    assert_error(api.get("/v0/records/rec_nope"), 404, "not_found")
    assert_error(api.get("/v0/ingestion-receipts/rcp_nope"), 404, "not_found")


# ----------------------------------------------------------------- listRecords


def test_list_records_keyset_paging(server, make_key, org, api):
    corpus = create_corpus(api, _cid("a"))
    other = create_corpus(api, _cid("b"))
    r = api.post("/v0/records/batch", json={"entries": [text_command(corpus, f"k{i}", f"t{i}") for i in range(4)]})
    receipts = [wait_resolved(api, i["receipt"]["receipt_id"]) for i in r.json()["items"]]
    wait_resolved(api, withdraw(api, withdrawal(corpus, "k1"))["receipt_id"])
    only_withdrawn = wait_resolved(api, withdraw(api, withdrawal(corpus, "w-only"))["receipt_id"])
    ingest_resolved(api, other, "elsewhere", "not in this corpus")
    expected = sorted([x["record_id"] for x in receipts] + [only_withdrawn["record_id"]])
    assert len(expected) == 5

    # part1 rule 6: keyset traversal in Record id order, withdrawn Records included.
    pages = list_all(api, corpus, 2)
    assert [len(p) for p in pages] == [2, 2, 1]  # next_page_cursor absent on the last page
    ids = [i["record_id"] for p in pages for i in p]
    assert ids == expected
    withdrawn = {i["record_id"]: i["withdrawn"] for p in pages for i in p}
    assert withdrawn[receipts[1]["record_id"]] is True and withdrawn[only_withdrawn["record_id"]] is True
    assert sum(withdrawn.values()) == 2
    for p in pages:
        for item in p:
            assert item["source"]["corpus_id"] == corpus
    # Conventions: next_page_cursor only when more remain (page exactly full at the end).
    assert [len(p) for p in list_all(api, corpus, 5)] == [5]
    assert [len(p) for p in list_all(api, corpus, 100)] == [5]
    default = api.get("/v0/records", params={"corpus_id": corpus}).json()  # limit defaults to 100
    assert [i["record_id"] for i in default["items"]] == expected and "next_page_cursor" not in default

    first = api.get("/v0/records", params={"corpus_id": corpus, "limit": 2}).json()
    cursor = first["next_page_cursor"]
    # part1 rule 6: a page cursor bound to another filter -> 409 cursor_scope_changed with resync_url.
    body = assert_error(api.get("/v0/records", params={"corpus_id": other, "page_cursor": cursor}),
                        409, "cursor_scope_changed")
    assert body["resync_url"] == f"/v0/records?corpus_id={other}"
    # ... or another authorization scope.
    with client_for(server, make_key(org, "content:read", f"{corpus},{other}")) as scoped:
        body = assert_error(scoped.get("/v0/records", params={"corpus_id": corpus, "page_cursor": cursor}),
                            409, "cursor_scope_changed")
        assert body["resync_url"] == f"/v0/records?corpus_id={corpus}"
    # Another key with the same scope may continue.
    with client_for(server, make_key(org)) as same_scope:
        r = same_scope.get("/v0/records", params={"corpus_id": corpus, "page_cursor": cursor, "limit": 2})
        assert r.status_code == 200 and [i["record_id"] for i in r.json()["items"]] == expected[2:4]

    # Conventions: cursors are opaque and tamper-evident.
    forged = tamper(cursor, after="")
    for bad in (forged, "not-a-cursor", cursor[:-3], cursor + "AA", "%%%"):
        body = assert_error(api.get("/v0/records", params={"corpus_id": corpus, "page_cursor": bad}),
                            422, "invalid_cursor")
        assert body["field"] == "/page_cursor"
    # A change-feed cursor is not a page cursor.
    change_cursor = api.get("/v0/changes", params={"corpus_id": corpus}).json()["next_cursor"]
    assert_error(api.get("/v0/records", params={"corpus_id": corpus, "page_cursor": change_cursor}),
                 422, "invalid_cursor")

    # decisions.md Errors: malformed query parameters -> 422 invalid_input, field /limit.
    for bad_limit in ("0", "101", "x", "-1", "1.5"):
        body = assert_error(api.get("/v0/records", params={"corpus_id": corpus, "limit": bad_limit}),
                            422, "invalid_input")
        assert body["field"] == "/limit"
    body = assert_error(api.get("/v0/records"), 422, "invalid_input")
    assert body["field"] == "/corpus_id"
    # Unknown query parameters are ignored.
    r = api.get("/v0/records", params={"corpus_id": corpus, "limit": 1, "colour": "red"})
    assert r.status_code == 200 and len(r.json()["items"]) == 1
    # A Corpus that does not exist in the Organization.
    assert_error(api.get("/v0/records", params={"corpus_id": "no-such-corpus"}), 404, "not_found")



def test_concurrent_retries_share_one_receipt(server, make_key, org, api):
    from concurrent.futures import ThreadPoolExecutor

    corpus = create_corpus(api, _cid())
    secret = make_key(org)
    cmd = text_command(corpus, "doc", "raced text")
    batch_cmd = text_command(corpus, "doc-b", "raced in batches")

    def send(i):
        with client_for(server, secret) as c:
            if i % 2:
                return "batch", c.post("/v0/records/batch", json={"entries": [batch_cmd]})
            return "single", c.post("/v0/records", json=cmd)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, range(16)))
    # Conventions + part1 rule 1: the same request under one key, however often and concurrently, is one Receipt.
    singles = [r for kind, r in results if kind == "single"]
    batches = [r for kind, r in results if kind == "batch"]
    assert all(r.status_code == 202 for r in singles), [r.text for r in singles]
    assert len({r.json()["receipt_id"] for r in singles}) == 1
    assert all(r.status_code == 200 for r in batches), [r.text for r in batches]
    assert {r.json()["items"][0]["status"] for r in batches} == {202}
    assert len({r.json()["items"][0]["receipt"]["receipt_id"] for r in batches}) == 1
    first = wait_resolved(api, singles[0].json()["receipt_id"])
    second = wait_resolved(api, batches[0].json()["items"][0]["receipt"]["receipt_id"])
    assert first["outcome"] == second["outcome"] == "created"
    listed = api.get("/v0/records", params={"corpus_id": corpus}).json()["items"]
    assert len(listed) == 2


def test_concurrent_single_ingests_each_get_their_own_answer(server, make_key, org, api):
    # docs/decisions.md "Group commit": concurrent single ingests of one key share a transaction,
    # and each request is answered as if alone (part1 rule 1 idempotency, rule 2 per-entry checks).
    from concurrent.futures import ThreadPoolExecutor

    corpus = create_corpus(api, _cid())
    secret = make_key(org)
    retried = text_command(corpus, "retried", "the same request sent eight times")
    contested = uuid.uuid4().hex
    requests = (
        [("distinct", text_command(corpus, f"d{i}", f"distinct text {i}")) for i in range(8)]
        + [("retried", retried)] * 8
        + [("contested", text_command(corpus, f"c{i}", f"contested body {i}", key=contested)) for i in range(4)]
        + [("unknown corpus", text_command(f"missing-{uuid.uuid4().hex[:6]}", f"u{i}", "x")) for i in range(4)]
    )

    def send(request):
        kind, body = request
        with client_for(server, secret) as c:
            return kind, c.post("/v0/records", json=body)

    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(send, requests))
    by_kind: dict[str, list] = {}
    for kind, r in answers:
        by_kind.setdefault(kind, []).append(r)
    assert all(r.status_code == 202 for r in by_kind["distinct"])
    assert len({r.json()["receipt_id"] for r in by_kind["distinct"]}) == 8
    assert all(r.status_code == 202 for r in by_kind["retried"])
    assert len({r.json()["receipt_id"] for r in by_kind["retried"]}) == 1
    assert sorted(r.status_code for r in by_kind["contested"]) == [202, 409, 409, 409]
    for r in by_kind["contested"]:
        if r.status_code == 409:
            assert_error(r, 409, "idempotency_conflict")
    for r in by_kind["unknown corpus"]:
        assert_error(r, 404, "not_found")
    for r in by_kind["distinct"] + by_kind["retried"][:1]:
        assert wait_resolved(api, r.json()["receipt_id"])["outcome"] == "created"


# ----------------------------------------------------------------- Blob references need blobs:read


def _manifest_with_blob(blob_id: str) -> dict:
    return {"kind": "manifest", "parts": [
        {"key": "intro", "role": "body", "content": {"kind": "text", "text": "Intro"}},
        {"key": "file", "role": "body", "content": {"kind": "blob", "blob_id": blob_id, "media_type": "text/plain"}},
    ]}


def test_a_blob_reference_needs_blobs_read_besides_content_write(server, make_key, org, api):
    corpus = create_corpus(api, _cid())
    blob = verified_blob(api, b"a verified blob of this organization")
    by_blob = blob_command(corpus, "blob", blob["blob_id"], "text/plain")
    by_part = {**blob_command(corpus, "part", "unused", "text/plain"), "content": _manifest_with_blob(blob["blob_id"])}
    # part1 rule 8: possessing an id grants nothing; decisions-part2 "Blob references": a Blob
    # reference needs blobs:read besides content:write, else 403 forbidden at the reference.
    with client_for(server, make_key(org, "content:write,content:read")) as writer:
        err = assert_error(writer.post("/v0/records", json=by_blob), 403, "forbidden")
        assert err["field"] == "/content/blob_id" and "blobs:read" in err["message"]
        err = assert_error(writer.post("/v0/records", json=by_part), 403, "forbidden")
        assert err["field"] == "/content/parts/1/content/blob_id"
        # part1 rule 2: a batch answers each entry on its own; text entries are unaffected.
        text = text_command(corpus, "text", "no blob here")
        r = writer.post("/v0/records/batch", json={"entries": [text, by_blob, by_part]})
        assert r.status_code == 200, r.text
        items = r.json()["items"]
        assert [i["status"] for i in items] == [202, 403, 403]
        assert [i["error"]["code"] for i in items[1:]] == ["forbidden", "forbidden"]
        assert items[1]["error"]["field"] == "/entries/1/content/blob_id"
        assert items[2]["error"]["field"] == "/entries/2/content/parts/1/content/blob_id"
    # Nothing was accepted for the refused commands: the same commands from a key with blobs:read
    # are new Receipts, created.
    with client_for(server, make_key(org, "content:write,content:read,blobs:read")) as reader:
        for cmd in (by_blob, by_part):
            r = reader.post("/v0/records", json=cmd)
            assert r.status_code == 202, r.text
            assert wait_resolved(reader, r.json()["receipt_id"])["outcome"] == "created"


def test_an_unknown_blob_or_another_organizations_blob_is_unverified_blob(server, make_key, org, api):
    corpus = create_corpus(api, _cid())
    other_org = f"org-{uuid.uuid4().hex[:8]}"
    with client_for(server, make_key(other_org)) as other:
        theirs = verified_blob(other, b"a blob of another organization")["blob_id"]
    # decisions-part2 "Blob references": an unknown Blob, or one of another Organization, is 422
    # unverified_blob (part1 rule 8: possessing its id grants nothing).
    for blob_id in ("blob_UNKNOWN", theirs):
        err = assert_error(api.post("/v0/records", json=blob_command(corpus, "x", blob_id, "text/plain")),
                           422, "unverified_blob")
        assert err["field"] == "/content/blob_id"
        cmd = {**blob_command(corpus, "y", "unused", "text/plain"), "content": _manifest_with_blob(blob_id)}
        err = assert_error(api.post("/v0/records", json=cmd), 422, "unverified_blob")
        assert err["field"] == "/content/parts/1/content/blob_id"
    ours = verified_blob(api, b"our own blob")["blob_id"]
    entries = [blob_command(corpus, "unknown", "blob_UNKNOWN", "text/plain"),
               blob_command(corpus, "theirs", theirs, "text/plain"),
               blob_command(corpus, "ours", ours, "text/plain"),
               {**blob_command(corpus, "theirs-part", "unused", "text/plain"), "content": _manifest_with_blob(theirs)}]
    r = api.post("/v0/records/batch", json={"entries": entries})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert [i["status"] for i in items] == [422, 422, 202, 422]
    assert [items[i]["error"]["field"] for i in (0, 1, 3)] == [
        "/entries/0/content/blob_id", "/entries/1/content/blob_id", "/entries/3/content/parts/1/content/blob_id"]
    assert {items[i]["error"]["code"] for i in (0, 1, 3)} == {"unverified_blob"}
