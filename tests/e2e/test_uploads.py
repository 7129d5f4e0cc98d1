"""Uploads and Blobs over real HTTP against a real `contentsvc run` process.

Covers part 1 rules 7 and 8 (createUpload, the presigned PUT, confirmUpload,
getUpload, getBlob), BlobContent ingestion through the built-in text path
and its diagnostics (part 1 "Diagnostic"), the Limits (one Blob 1 GiB,
configurable), and decisions.md "Uploads and Blobs" and its resolved
ambiguities. The PUT is sent without an API key, as a client would.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, wait_resolved

GiB = 1024 * 1024 * 1024


# ----------------------------------------------------------------- helpers


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_request(data: bytes, media_type: str = "text/plain", **overrides) -> dict:
    return {"idempotency_key": uuid.uuid4().hex, "media_type": media_type, "size_bytes": len(data),
            "sha256": sha(data), **overrides}


def create_upload(client: httpx.Client, data: bytes, media_type: str = "text/plain", **overrides) -> dict:
    r = client.post("/v0/uploads", json=upload_request(data, media_type, **overrides))
    assert r.status_code == 201, r.text
    return r.json()


def put_content(upload: dict, data, headers: dict | None = None) -> httpx.Response:
    """The presigned PUT: no Authorization header, the Upload's put_headers."""
    return httpx.put(upload["put_url"], content=data, headers=upload["put_headers"] if headers is None else headers,
                     timeout=30)


def confirm(client: httpx.Client, upload_id: str, **kwargs) -> dict:
    r = client.post(f"/v0/uploads/{upload_id}/confirm", **kwargs)
    assert r.status_code == 202, r.text
    return r.json()


def get_upload(client: httpx.Client, upload_id: str) -> dict:
    r = client.get(f"/v0/uploads/{upload_id}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_state(client: httpx.Client, upload_id: str, states: set[str], timeout: float = 30.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        upload = get_upload(client, upload_id)
        if upload["state"] in states:
            return upload
        time.sleep(0.05)
    raise AssertionError(f"upload {upload_id} never reached {states}")


def verified_blob(client: httpx.Client, data: bytes, media_type: str = "text/plain") -> dict:
    """The whole story of part 1 rule 7: create, PUT, confirm, poll until verified."""
    upload = create_upload(client, data, media_type)
    r = put_content(upload, data)
    assert r.status_code == 200, r.text
    confirm(client, upload["upload_id"])
    upload = wait_state(client, upload["upload_id"], {"verified", "failed"})
    assert upload["state"] == "verified", upload
    return upload


def blob_command(corpus_id: str, record_key: str, blob_id: str, media_type: str, **extra) -> dict:
    return {
        "idempotency_key": uuid.uuid4().hex,
        "source": {"corpus_id": corpus_id, "namespace": "uploads", "record_key": record_key},
        "content": {"kind": "blob", "blob_id": blob_id, "media_type": media_type},
        **extra,
    }


def ingest_resolved(client: httpx.Client, cmd: dict) -> dict:
    r = client.post("/v0/records", json=cmd)
    assert r.status_code == 202, r.text
    return wait_resolved(client, r.json()["receipt_id"])


def version_of(client: httpx.Client, receipt: dict) -> dict:
    r = client.get(f"/v0/records/{receipt['record_id']}/versions/{receipt['version_id']}")
    assert r.status_code == 200, r.text
    return r.json()


def journal_kinds(database_url: str, upload_id: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT kind, public FROM journal WHERE subject_type = 'upload' AND subject_id = %s"
                            " ORDER BY position", (upload_id,)).fetchall()
    assert not any(public for _, public in rows)  # uploads have no Corpus: no change feed shows them
    return [kind for kind, _ in rows]


def _cid() -> str:
    return f"up-{uuid.uuid4().hex[:10]}"


# ----------------------------------------------------------------- the story


def test_whole_upload_story_then_ingest_text_blob(api, database_url):
    data = "Über die Brücke: a text Blob, normalized by the built-in text path.\n".encode()
    r = api.post("/v0/uploads", json=upload_request(data, "text/plain; charset=utf-8", filename="note.txt"))
    # part1 rule 7: createUpload issues a session with one presigned PUT URL, required headers and an expiry (201).
    assert r.status_code == 201, r.text
    upload = r.json()
    assert r.headers["location"] == f"/v0/uploads/{upload['upload_id']}"
    # decisions.md Uploads and Blobs: the Upload's members; blob_id exists from creation.
    assert set(upload) == {"upload_id", "state", "put_url", "put_headers", "expires_at", "media_type", "size_bytes",
                           "sha256", "blob_id"}
    assert upload["upload_id"].startswith("upl_") and upload["blob_id"].startswith("blob_")
    assert upload["state"] == "awaiting_upload"
    assert upload["put_headers"] == {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(data)),
                                     "x-content-sha256": sha(data)}
    assert "expires=" in upload["put_url"] and "signature=" in upload["put_url"]
    assert get_upload(api, upload["upload_id"]) == upload  # part1 rule 7: getUpload observes it at once

    # decisions.md Uploads and Blobs: the presigned PUT needs no API key.
    r = put_content(upload, data)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "verifying"

    # part1 rule 7: confirmUpload starts verification (202); decisions.md: an empty body is accepted.
    confirmed = confirm(api, upload["upload_id"])
    assert confirmed["upload_id"] == upload["upload_id"]
    verified = wait_state(api, upload["upload_id"], {"verified", "failed"})
    assert verified["state"] == "verified" and "error" not in verified

    # part1 rule 8: getBlob answers verified Blob metadata.
    r = api.get(f"/v0/blobs/{upload['blob_id']}")
    assert r.status_code == 200, r.text
    blob = r.json()
    assert set(blob) == {"blob_id", "media_type", "size_bytes", "sha256", "created_at"}
    assert blob["blob_id"] == upload["blob_id"] and blob["size_bytes"] == len(data) and blob["sha256"] == sha(data)
    assert blob["media_type"] == "text/plain; charset=utf-8"

    # Issue 5: a Record whose content is that Blob; text/* goes through the built-in text path.
    corpus = create_corpus(api, _cid())
    receipt = ingest_resolved(api, blob_command(corpus, "note", upload["blob_id"], "text/plain", title="Note"))
    assert receipt["outcome"] == "created" and receipt["diagnostics"] == []
    assert receipt["availability"]["state"] != "quarantined"
    version = version_of(api, receipt)
    assert version["manifest"]["parts"] == [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": "Note"}},
        {"key": "body", "role": "body", "content": {"kind": "text", "text": data.decode()}},
    ]
    # Issue 5: ... and it becomes searchable like any text Record.
    deadline = time.time() + 30
    while not receipt["availability"]["searchable"] and time.time() < deadline:
        time.sleep(0.1)
        receipt = api.get(f"/v0/ingestion-receipts/{receipt['receipt_id']}").json()
    assert receipt["availability"]["searchable"] is True, receipt
    # Issue 5: events for every step in the journal.
    assert journal_kinds(database_url, upload["upload_id"]) == ["upload.created", "upload.received",
                                                                "upload.verified"]


def test_create_upload_is_idempotent(api):
    data = b"idempotent"
    body = upload_request(data)
    first = api.post("/v0/uploads", json=body)
    assert first.status_code == 201, first.text
    # part1 Conventions: same key and same canonical request returns the first result (200 on replay,
    # as createCorpus: docs/decisions.md Uploads).
    again = api.post("/v0/uploads", json=dict(reversed(list(body.items()))))
    assert again.status_code == 200, again.text
    assert again.json()["upload_id"] == first.json()["upload_id"]
    assert again.json()["put_url"] == first.json()["put_url"]
    # ... and the same key with a different request is 409 idempotency_conflict.
    assert_error(api.post("/v0/uploads", json={**body, "size_bytes": 11}), 409, "idempotency_conflict")


def test_oversized_upload_refused_before_a_session(api, database_url, org):
    # part1 rule 7 and Limits: one Blob 1 GiB by default; oversized uploads are rejected before a session.
    err = assert_error(api.post("/v0/uploads", json=upload_request(b"x", size_bytes=GiB + 1)), 413,
                       "request_too_large")
    assert err["field"] == "/size_bytes" and str(GiB) in err["message"]
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM uploads WHERE org_id = %s", (org,)).fetchone()[0] == 0
    # Exactly the limit is allowed.
    assert api.post("/v0/uploads", json=upload_request(b"x", size_bytes=GiB)).status_code == 201


def test_create_upload_schema(api):
    # decisions.md Resolved ambiguities: a wrong member is 422 invalid_schema with a pointer.
    err = assert_error(api.post("/v0/uploads", json=upload_request(b"x", sha256="ABC")), 422, "invalid_schema")
    assert err["field"] == "/sha256"
    err = assert_error(api.post("/v0/uploads", json=upload_request(b"x", size_bytes=0)), 422, "invalid_schema")
    assert err["field"] == "/size_bytes"
    err = assert_error(api.post("/v0/uploads", json=upload_request(b"x", media_type="plain")), 422, "invalid_schema")
    assert err["field"] == "/media_type"
    err = assert_error(api.post("/v0/uploads", json={**upload_request(b"x"), "color": "red"}), 422, "invalid_schema")
    assert err["field"] == "/color"


# ----------------------------------------------------------------- verification failures


def test_wrong_checksum_fails_with_checksum_mismatch(api, database_url):
    declared = b"the bytes the client meant"
    sent = b"the bytes that were sent!!"
    assert len(declared) == len(sent)
    upload = create_upload(api, declared)
    r = put_content(upload, sent)  # the headers match the session; the bytes do not
    assert r.status_code == 200, r.text
    confirm(api, upload["upload_id"])
    failed = wait_state(api, upload["upload_id"], {"verified", "failed"})
    # decisions.md Uploads and Blobs: checksum mismatch -> failed, error checksum_mismatch (an Error object).
    assert failed["state"] == "failed"
    assert failed["error"]["code"] == "checksum_mismatch" and failed["error"]["retryable"] is False
    assert set(failed["error"]) <= {"code", "message", "retryable", "field", "resync_url"}
    # part1 rule 8: only verified Blobs exist.
    assert_error(api.get(f"/v0/blobs/{upload['blob_id']}"), 404, "not_found")
    assert journal_kinds(database_url, upload["upload_id"]) == ["upload.created", "upload.received", "upload.failed"]


def raw_put_truncated(url: str, headers: dict[str, str], body_part: bytes) -> None:
    """A PUT that announces Content-Length but closes the connection before sending it all."""
    u = httpx.URL(url)
    with socket.create_connection((u.host, u.port), timeout=10) as s:
        head = f"PUT {u.raw_path.decode()} HTTP/1.1\r\nHost: {u.host}:{u.port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        s.sendall(head.encode() + body_part)
        s.shutdown(socket.SHUT_WR)
        try:
            while s.recv(65536):
                pass
        except OSError:
            pass


def test_truncated_body_fails_with_size_mismatch(api):
    # docs/decisions.md Uploads: Content-Length must equal size_bytes, so a size mismatch is a body that
    # ends early; what arrived is recorded and verification fails with size_mismatch.
    data = b"0123456789" * 100
    upload = create_upload(api, data)
    raw_put_truncated(upload["put_url"], upload["put_headers"], data[:400])
    wait_state(api, upload["upload_id"], {"verifying"})
    confirm(api, upload["upload_id"])
    failed = get_upload(api, upload["upload_id"])
    assert failed["state"] == "failed" and failed["error"]["code"] == "size_mismatch", failed
    # How many of the 400 bytes the server read before the connection closed varies; never all 1000.
    assert "declared 1000" in failed["error"]["message"]
    # A failed session takes no second PUT.
    assert_error(put_content(upload, data), 409, "upload_already_received")


# ----------------------------------------------------------------- the presigned PUT's guards


def _with_query(url: str, **changes) -> str:
    u = httpx.URL(url)
    params = dict(u.params)
    for k, v in changes.items():
        if v is None:
            params.pop(k, None)
        else:
            params[k] = v
    return str(u.copy_with(params=params))


def test_tampered_or_missing_signature_is_403(api):
    data = b"signed"
    upload = create_upload(api, data)
    other = create_upload(api, b"other")
    sig = httpx.URL(upload["put_url"]).params["signature"]
    expires = int(httpx.URL(upload["put_url"]).params["expires"])
    flipped = ("A" if sig[0] != "A" else "B") + sig[1:]
    forged_urls = [
        _with_query(upload["put_url"], signature=flipped),
        _with_query(upload["put_url"], expires=str(expires + 3600)),  # a later expiry, same signature
        _with_query(upload["put_url"], signature=None),
        _with_query(upload["put_url"], expires=None),
        # another session's valid signature on this session's path
        _with_query(upload["put_url"], signature=httpx.URL(other["put_url"]).params["signature"]),
    ]
    for url in forged_urls:
        # Issue 5: the PUT is served at an HMAC-signed URL; a bad or tampered signature is refused.
        assert_error(put_content({**upload, "put_url": url}, data), 403, "invalid_signature")
    assert get_upload(api, upload["upload_id"])["state"] == "awaiting_upload"
    assert put_content(upload, data).status_code == 200


def test_missing_or_mismatched_headers_are_refused(api):
    data = b"headers matter"
    upload = create_upload(api, data, "text/markdown")
    h = upload["put_headers"]
    # Issue 5: the PUT requires its headers; missing ones are 400, mismatched ones 422.
    no_sha = {k: v for k, v in h.items() if k != "x-content-sha256"}
    assert_error(put_content(upload, data, no_sha), 400, "missing_header")
    no_type = {k: v for k, v in h.items() if k != "Content-Type"}
    assert_error(put_content(upload, data, no_type), 400, "missing_header")
    chunked = {k: v for k, v in h.items() if k != "Content-Length"}  # a generator body goes chunked
    assert_error(put_content(upload, (c for c in [data[:5], data[5:]]), chunked), 400, "missing_header")
    assert_error(put_content(upload, data, {**h, "Content-Type": "text/plain"}), 422, "header_mismatch")
    assert_error(put_content(upload, data, {**h, "x-content-sha256": sha(b"other")}), 422, "header_mismatch")
    longer = data + b"!"
    assert_error(put_content(upload, longer, {**h, "Content-Length": str(len(longer))}), 422, "header_mismatch")
    # None of these stored anything: the session still takes its one PUT.
    assert get_upload(api, upload["upload_id"])["state"] == "awaiting_upload"
    equivalent = {**h, "Content-Type": "Text/Markdown"}  # media type names are case-insensitive
    assert put_content(upload, data, equivalent).status_code == 200


def test_second_put_is_refused(api):
    data = b"once only"
    upload = create_upload(api, data)
    assert put_content(upload, data).status_code == 200
    # Issue 5: a second PUT after the bytes were received, or after verification, is refused.
    assert_error(put_content(upload, data), 409, "upload_already_received")
    confirm(api, upload["upload_id"])
    assert wait_state(api, upload["upload_id"], {"verified"})
    assert_error(put_content(upload, b"ONCE ONLY"), 409, "upload_already_received")


def test_replayed_confirm_observes_the_same_outcome(api, database_url):
    data = b"confirm me"
    upload = create_upload(api, data)
    # decisions.md: confirmUpload takes an optional ActionRequest; before any bytes it observes awaiting_upload.
    assert confirm(api, upload["upload_id"])["state"] == "awaiting_upload"
    assert put_content(upload, data).status_code == 200
    body = {"idempotency_key": uuid.uuid4().hex}
    first = confirm(api, upload["upload_id"], json=body)
    # part1 rule 7: confirmUpload may be repeated for the session.
    again = confirm(api, upload["upload_id"], json=body)
    empty = confirm(api, upload["upload_id"], content=b"")
    assert first["state"] == again["state"] == empty["state"] == "verified"
    assert journal_kinds(database_url, upload["upload_id"]).count("upload.verified") == 1
    # part1 Conventions: the same key on another request is 409 idempotency_conflict.
    other = create_upload(api, b"another")
    assert_error(api.post(f"/v0/uploads/{other['upload_id']}/confirm", json=body), 409, "idempotency_conflict")
    # decisions.md Resolved ambiguities: not JSON 400, unknown member 422.
    assert_error(api.post(f"/v0/uploads/{upload['upload_id']}/confirm", content=b"{nope"), 400, "malformed_json")
    assert_error(api.post(f"/v0/uploads/{upload['upload_id']}/confirm", json={"x": 1}), 422, "invalid_schema")
    assert_error(api.post("/v0/uploads/upl_UNKNOWN/confirm"), 404, "not_found")


# ----------------------------------------------------------------- authorization


def test_another_organization_sees_nothing(api, server, make_key):
    upload = verified_blob(api, b"private bytes")
    with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as stranger:
        # part1 rule 8 and Authentication 3: another Organization's resource is 404, never 403.
        assert_error(stranger.get(f"/v0/blobs/{upload['blob_id']}"), 404, "not_found")
        assert_error(stranger.get(f"/v0/uploads/{upload['upload_id']}"), 404, "not_found")
        assert_error(stranger.post(f"/v0/uploads/{upload['upload_id']}/confirm"), 404, "not_found")
        # ... and possessing a blob_id grants nothing at ingestion either.
        corpus = create_corpus(stranger, _cid())
        err = assert_error(stranger.post("/v0/records", json=blob_command(corpus, "k", upload["blob_id"],
                                                                         "text/plain")), 422, "unverified_blob")
        assert err["field"] == "/content/blob_id"


def test_blobs_actions_are_enforced(api, server, make_key, org):
    upload = verified_blob(api, b"guarded")
    # part1 Authentication 3, 4: blobs:read and blobs:write are enforced (403 forbidden).
    with client_for(server, make_key(org, "blobs:read")) as reader:
        assert get_upload(reader, upload["upload_id"])["state"] == "verified"
        assert reader.get(f"/v0/blobs/{upload['blob_id']}").status_code == 200
        assert_error(reader.post("/v0/uploads", json=upload_request(b"x")), 403, "forbidden")
        assert_error(reader.post(f"/v0/uploads/{upload['upload_id']}/confirm"), 403, "forbidden")
    with client_for(server, make_key(org, "blobs:write")) as writer:
        assert writer.post("/v0/uploads", json=upload_request(b"x")).status_code == 201
        assert_error(writer.get(f"/v0/uploads/{upload['upload_id']}"), 403, "forbidden")
        assert_error(writer.get(f"/v0/blobs/{upload['blob_id']}"), 403, "forbidden")
    with httpx.Client(base_url=server.base_url) as anonymous:
        assert_error(anonymous.post("/v0/uploads", json=upload_request(b"x")), 401, "invalid_api_key")
        assert_error(anonymous.get(f"/v0/blobs/{upload['blob_id']}"), 401, "invalid_api_key")


def test_put_url_ignores_a_forged_host_header(api, server):
    data = b"bytes for the real server"
    # The presigned URL is built from the configured public base URL (default: the address the
    # server listens on), never from request headers: a forged Host or X-Forwarded-Host does not
    # send the client's bytes elsewhere.
    forged = {"Host": "attacker.example", "X-Forwarded-Host": "attacker.example", "X-Forwarded-Proto": "https"}
    r = api.post("/v0/uploads", json=upload_request(data), headers=forged)
    assert r.status_code == 201, r.text
    upload = r.json()
    assert upload["put_url"].startswith(f"{server.base_url}/v0/uploads/{upload['upload_id']}/content?"), upload
    r = api.get(f"/v0/uploads/{upload['upload_id']}", headers=forged)
    assert r.status_code == 200 and r.json()["put_url"] == upload["put_url"]
    assert put_content(upload, data).status_code == 200


def test_put_url_uses_the_configured_public_base_url(database_url, make_key, tmp_path):
    org = f"org-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "contentsvc.toml"
    config.write_text('[api]\npublic_base_url = "https://files.example.test/content"\n')
    proxied = ServerProcess(database_url, tmp_path, extra_env={"CONTENTSVC_CONFIG": str(config)})
    try:
        with client_for(proxied, make_key(org)) as client:
            data = b"through the proxy"
            # api.public_base_url: where clients reach the API, e.g. behind a proxy; a forged Host
            # changes nothing.
            r = client.post("/v0/uploads", json=upload_request(data), headers={"Host": "attacker.example"})
            assert r.status_code == 201, r.text
            upload = r.json()
            prefix = f"https://files.example.test/content/v0/uploads/{upload['upload_id']}/content?"
            assert upload["put_url"].startswith(prefix), upload
            # What the proxy forwards to the API (the same path and query) is a valid presigned PUT.
            direct = upload["put_url"].replace("https://files.example.test/content", proxied.base_url)
            assert put_content({**upload, "put_url": direct}, data).status_code == 200
    finally:
        proxied.stop()


# ----------------------------------------------------------------- ingest with BlobContent


def test_ingest_of_an_unverified_blob_is_422(api):
    corpus = create_corpus(api, _cid())
    data = b"not yet"
    upload = create_upload(api, data)
    # decisions.md: Upload.blob_id exists from creation; referencing it before verified is 422 unverified_blob.
    err = assert_error(api.post("/v0/records", json=blob_command(corpus, "a", upload["blob_id"], "text/plain")),
                       422, "unverified_blob")
    assert err["field"] == "/content/blob_id"
    assert put_content(upload, data).status_code == 200  # received, not yet confirmed: still unverified
    assert_error(api.post("/v0/records", json=blob_command(corpus, "a", upload["blob_id"], "text/plain")),
                 422, "unverified_blob")
    assert_error(api.post("/v0/records", json=blob_command(corpus, "a", "blob_UNKNOWN", "text/plain")),
                 422, "unverified_blob")
    manifest = {"kind": "manifest", "parts": [
        {"key": "intro", "role": "body", "content": {"kind": "text", "text": "Intro"}},
        {"key": "file", "role": "body", "content": {"kind": "blob", "blob_id": upload["blob_id"],
                                                    "media_type": "text/plain"}},
    ]}
    err = assert_error(api.post("/v0/records", json={**blob_command(corpus, "b", "x", "text/plain"),
                                                     "content": manifest}), 422, "unverified_blob")
    assert err["field"] == "/content/parts/1/content/blob_id"
    # part1 rule 2: a batch answers the entry's own error.
    r = api.post("/v0/records/batch", json={"entries": [blob_command(corpus, "c", upload["blob_id"], "text/plain")]})
    assert r.status_code == 200, r.text
    [item] = r.json()["items"]
    assert item["status"] == 422 and item["error"]["code"] == "unverified_blob"
    assert item["error"]["field"] == "/entries/0/content/blob_id"


def test_ingest_of_a_media_type_no_route_reads_is_422(api):
    corpus = create_corpus(api, _cid())
    pdf = verified_blob(api, b"%PDF-1.7 not really", "application/pdf")
    # Issue 5: a media type that no route can read is refused at acceptance with a clear 422.
    err = assert_error(api.post("/v0/records", json=blob_command(corpus, "p", pdf["blob_id"], "application/pdf")),
                       422, "unsupported_media_type")
    assert err["field"] == "/content/media_type" and "text/*" in err["message"]
    text = verified_blob(api, b"plain")
    err = assert_error(api.post("/v0/records", json=blob_command(corpus, "q", text["blob_id"],
                                                                 "text/plain; charset=no-such-charset")),
                       422, "unsupported_media_type")
    assert "no-such-charset" in err["message"]


def test_html_markdown_and_latin1_blobs_are_normalized(api):
    corpus = create_corpus(api, _cid())
    html = (b"<html><head><title>Caf\xc3\xa9</title><style>p {color: red}</style></head><body>"
            b"<h1>Menu</h1><p>Soup &amp; bread,\n  fresh</p><script>alert('x')</script><p>Tea</p></body></html>")
    markdown = b"# Heading\n\nSome *emphasis* and a [link](http://example.org).\n"
    latin1 = "Cr\u00e8me br\u00fbl\u00e9e, na\u00efve".encode("latin-1")
    cases = [
        (html, "text/html", "Caf\u00e9\nMenu\nSoup & bread, fresh\nTea"),
        (markdown, "text/markdown", markdown.decode()),
        (latin1, "text/plain; charset=ISO-8859-1", "Cr\u00e8me br\u00fbl\u00e9e, na\u00efve"),
        # NFC: a decomposed e + combining acute becomes one code point.
        ("Cafe\u0301".encode(), "text/plain", "Caf\u00e9"),
    ]
    for i, (data, media_type, expected) in enumerate(cases):
        blob = verified_blob(api, data, media_type)
        receipt = ingest_resolved(api, blob_command(corpus, f"doc-{i}", blob["blob_id"], media_type))
        # Issue 5: text/* goes through the built-in text path (charset from the media type, HTML reduced
        # to its text, Markdown kept as text).
        assert receipt["outcome"] == "created" and receipt["diagnostics"] == [], receipt
        [part] = version_of(api, receipt)["manifest"]["parts"]
        assert part == {"key": "body", "role": "body", "content": {"kind": "text", "text": expected}}


def test_blob_part_in_a_manifest_and_duplicates(api):
    corpus = create_corpus(api, _cid())
    blob = verified_blob(api, b"chapter one", "text/plain")
    manifest = {"kind": "manifest", "parts": [
        {"key": "intro", "role": "body", "content": {"kind": "text", "text": "Intro"}},
        {"key": "file", "role": "body", "content": {"kind": "blob", "blob_id": blob["blob_id"],
                                                    "media_type": "text/plain"}},
    ]}
    cmd = {**blob_command(corpus, "m", "unused", "text/plain"), "content": manifest}
    receipt = ingest_resolved(api, cmd)
    assert receipt["outcome"] == "created"
    parts = version_of(api, receipt)["manifest"]["parts"]
    assert [p["content"] for p in parts] == [{"kind": "text", "text": "Intro"}, {"kind": "text", "text": "chapter one"}]
    # decisions.md Records: the same normalized text again under the identity is a duplicate.
    again = ingest_resolved(api, {**cmd, "idempotency_key": uuid.uuid4().hex})
    assert again["outcome"] == "duplicate" and again["version_id"] == receipt["version_id"]


def test_undecodable_bytes_quarantine_the_version(api):
    corpus = create_corpus(api, _cid())
    blob = verified_blob(api, b"caf\xe9 \xff\xfe not utf-8", "text/plain")
    receipt = ingest_resolved(api, blob_command(corpus, "bad", blob["blob_id"], "text/plain"))
    # Issue 5: undecodable bytes quarantine the Version with a diagnostic; the Receipt still resolves.
    assert receipt["outcome"] == "created"
    [diagnostic] = receipt["diagnostics"]
    assert diagnostic["code"] == "normalizer_failed" and "utf-8" in diagnostic["message"]
    assert diagnostic["retryable"] is False
    # part1 Availability: quarantined, not searchable; and never current (part1 "Diagnostic", issue 11).
    assert receipt["availability"] == {"state": "quarantined", "is_current": False, "searchable": False}
    version = version_of(api, receipt)
    assert version["availability"]["state"] == "quarantined" and version["availability"]["searchable"] is False
    assert version["diagnostics"] == [diagnostic]
    # The quarantined Version keeps the Blob reference as its manifest.
    assert version["manifest"]["parts"][0]["content"] == {"kind": "blob", "blob_id": blob["blob_id"],
                                                          "media_type": "text/plain"}


def test_a_text_blob_holding_u0000_quarantines_its_version_and_holds_up_nothing_else(api):
    # Issue 5, docs/decisions.md Uploads: no stored text holds U+0000. Such a Blob's text once stopped
    # the materializer's fold for every later Version; now its own Version is quarantined.
    corpus = create_corpus(api, _cid())
    utf16 = "cranes at the harbour".encode("utf-16-le")  # the usual cause: UTF-16 read as UTF-8
    blob = verified_blob(api, utf16, "text/plain")
    receipt = ingest_resolved(api, blob_command(corpus, "nul", blob["blob_id"], "text/plain"))
    assert receipt["outcome"] == "created" and receipt["availability"]["state"] == "quarantined"
    [diagnostic] = receipt["diagnostics"]
    assert diagnostic["code"] == "normalizer_failed" and "U+0000" in diagnostic["message"]
    # Declared as what it is, the same bytes are text.
    declared = "text/plain; charset=utf-16-le"
    blob = verified_blob(api, utf16, declared)
    receipt = ingest_resolved(api, blob_command(corpus, "utf16", blob["blob_id"], declared))
    assert receipt["availability"]["state"] != "quarantined", receipt
    assert version_of(api, receipt)["manifest"]["parts"][0]["content"]["text"] == "cranes at the harbour"


def test_large_streamed_text_blob_over_the_text_path_limit_is_quarantined(api):
    corpus = create_corpus(api, _cid())
    data = b"word " * (2 * 1024 * 1024) + b"!"  # 10 MiB + 1 byte, streamed in 1 MiB chunks
    upload = create_upload(api, data)
    r = put_content(upload, (data[i:i + 1024 * 1024] for i in range(0, len(data), 1024 * 1024)))
    assert r.status_code == 200, r.text
    assert confirm(api, upload["upload_id"])["state"] == "verified"
    receipt = ingest_resolved(api, blob_command(corpus, "big", upload["blob_id"], "text/plain"))
    # docs/decisions.md Uploads: the built-in text path reads text Blobs up to 8 MiB; larger ones quarantine.
    assert receipt["outcome"] == "created" and receipt["availability"]["state"] == "quarantined"
    [diagnostic] = receipt["diagnostics"]
    assert diagnostic["code"] == "normalizer_failed" and str(8 * 1024 * 1024) in diagnostic["message"]


def test_openapi_lists_the_upload_operations(server):
    doc = httpx.get(f"{server.base_url}/schema/openapi.json").json()
    operations = {op["operationId"]: (path, method) for path, ops in doc["paths"].items() for method, op in ops.items()}
    assert operations["createUpload"] == ("/v0/uploads", "post")
    assert operations["putUploadContent"] == ("/v0/uploads/{upload_id}/content", "put")
    assert operations["confirmUpload"] == ("/v0/uploads/{upload_id}/confirm", "post")
    assert operations["getUpload"] == ("/v0/uploads/{upload_id}", "get")
    assert operations["getBlob"] == ("/v0/blobs/{blob_id}", "get")
    assert {"UploadRequest", "Upload", "Blob", "ActionRequest"} <= set(doc["components"]["schemas"])
    assert "security" not in doc["paths"]["/v0/uploads/{upload_id}/content"]["put"]  # no API key on the PUT


def _stored_path(server, sha256_hex: str) -> Path:
    return Path(server.home) / "blobs" / "sha256" / sha256_hex[:2] / sha256_hex[2:4] / sha256_hex


def test_blob_no_longer_verified_at_processing_is_input_unverified(api, server):
    corpus = create_corpus(api, _cid())
    data = f"soon altered {uuid.uuid4().hex}".encode()
    blob = verified_blob(api, data, "text/plain")
    path = _stored_path(server, sha(data))
    # decisions.md Uploads and Blobs: bytes go to a directory under CONTENTSVC_HOME, content addressed.
    assert path.read_bytes() == data
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered after verification")
    receipt = ingest_resolved(api, blob_command(corpus, "alt", blob["blob_id"], "text/plain"))
    # part1 Diagnostic: input_unverified, the input Blob was no longer the verified accepted input.
    assert receipt["outcome"] == "created"
    assert [d["code"] for d in receipt["diagnostics"]] == ["input_unverified"]
    assert receipt["availability"]["state"] == "quarantined"


# ----------------------------------------------------------------- expiry and the configured limit


def test_expired_url_and_configured_limit(database_url, make_key, tmp_path):
    org = f"org-{uuid.uuid4().hex[:8]}"
    short = ServerProcess(database_url, tmp_path,
                          extra_env={"CONTENTSVC_UPLOAD_URL_TTL": "1", "CONTENTSVC_MAX_BLOB_BYTES": "1000"})
    try:
        with client_for(short, make_key(org)) as client:
            # part1 Limits: the Blob limit is configurable (CONTENTSVC_MAX_BLOB_BYTES); the message names it.
            err = assert_error(client.post("/v0/uploads", json=upload_request(b"x", size_bytes=1001)), 413,
                               "request_too_large")
            assert "1000" in err["message"] and err["field"] == "/size_bytes"
            data = b"too late"
            upload = create_upload(client, data)
            expires = int(httpx.URL(upload["put_url"]).params["expires"])
            while time.time() < expires + 0.2:  # wait out the session's one-second URL
                time.sleep(0.2)
            # Issue 5: an expired session refuses the PUT.
            assert_error(put_content(upload, data), 410, "upload_expired")
            # Confirming a session that expired without bytes fails it with upload_expired.
            failed = confirm(client, upload["upload_id"])
            assert failed["state"] == "failed" and failed["error"]["code"] == "upload_expired"
    finally:
        short.stop()


# ----------------------------------------------------------------- the read model and a replay agree


async def _replayed_rows(database_url: str, org: str) -> dict[str, list[tuple]]:
    from contentsvc.journal.store import read_after
    from contentsvc.readmodel.fold import fold

    schema = f"replay_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            await conn.execute(f"CREATE SCHEMA {schema}")
            for table in ("uploads", "blobs"):
                await conn.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL)")
            await conn.execute(f"SET LOCAL search_path = {schema}, public")
            position = 0
            while events := await read_after(conn, position, 2000):
                await fold(conn, [e for e in events if e.kind.startswith("upload.") and e.org_id == org])
                position = events[-1].position
            out = {}
            for table, key in (("uploads", "upload_id"), ("blobs", "blob_id")):
                cur = await conn.execute(f"SELECT * FROM {schema}.{table} WHERE org_id = %s ORDER BY {key}", (org,))
                out[table] = await cur.fetchall()
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return out


def test_inline_folds_and_a_replay_agree(api, database_url, org):
    import asyncio

    verified_blob(api, b"replayed")  # verified
    bad = create_upload(api, b"declared")
    assert put_content(bad, b"DECLARED").status_code == 200
    confirm(api, bad["upload_id"])  # failed: checksum_mismatch
    create_upload(api, b"never sent")  # awaiting_upload
    received = create_upload(api, b"sent")
    assert put_content(received, b"sent").status_code == 200  # verifying
    # Issue 5 design: uploads and blobs are folds of upload.* events; the rows the commands wrote
    # inline are the rows a replay from position 0 writes.
    replayed = asyncio.run(_replayed_rows(database_url, org))
    with psycopg.connect(database_url) as conn:
        for table, key in (("uploads", "upload_id"), ("blobs", "blob_id")):
            live = conn.execute(f"SELECT * FROM {table} WHERE org_id = %s ORDER BY {key}", (org,)).fetchall()
            assert live == replayed[table], table
    assert [r[3] for r in replayed["uploads"]] == ["verified", "failed", "awaiting_upload", "verifying"]
    assert len(replayed["blobs"]) == 1
