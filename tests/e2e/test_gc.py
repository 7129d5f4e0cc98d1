"""Disk that only grows: `contentsvc gc` and the gc worker against a real `contentsvc run`,
real PostgreSQL and real files.

A replay retires the serving index generation (its directory stays until the
grace passes); a verified Blob that no ingest references is collected once its
upload expired, and from then on a reference to it is refused as
`unverified_blob` (part 1 rule 7) and getBlob does not find it (rule 8); a
referenced Blob is kept, as its Versions stay readable.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import (ServerProcess, assert_error, client_for, create_corpus, key_for, status_table_rows,
                            text_command, wait_current)
from tests.e2e.test_uploads import (blob_command, confirm, create_upload, ingest_resolved, put_content, sha,
                                    verified_blob)

UPLOAD_TTL = 3  # seconds: long enough to PUT and confirm, short enough to wait out


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTENTSVC_DATABASE_URL": server.database_url, "CONTENTSVC_HOME": str(server.home),
           "CONTENTSVC_GC_RETIRED_GENERATION_GRACE": "1"}
    return subprocess.run([sys.executable, "-m", "contentsvc.cli", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def generation_dirs(server: ServerProcess, kind: str) -> dict[str, tuple[str, Path]]:
    with psycopg.connect(server.database_url) as conn:
        rows = conn.execute("SELECT generation_id, state FROM search_generations WHERE kind = %s", (kind,)).fetchall()
    return {gid: (state, server.home / "indexes" / kind / gid) for gid, state in rows}


def blob_file(server: ServerProcess, database_url: str, blob_id: str) -> Path:
    with psycopg.connect(database_url) as conn:
        key = conn.execute("SELECT storage_key FROM blobs WHERE blob_id = %s", (blob_id,)).fetchone()[0]
    return server.home / "blobs" / key


def wait_expired(upload: dict) -> None:
    """Until the upload's expiry (whole seconds, RFC 3339) has passed."""
    expires = int(httpx.URL(upload["put_url"]).params["expires"])
    deadline = time.time() + UPLOAD_TTL + 5
    while time.time() <= expires + 0.5:
        assert time.time() < deadline
        time.sleep(0.2)


def search_hits(client: httpx.Client, query: str, corpus: str) -> list[dict]:
    r = client.post("/v0/search", json={"query": query, "corpus_ids": [corpus], "mode": "lexical"})
    assert r.status_code == 200, r.text
    return r.json()["items"]


@pytest.fixture(scope="module")
def gc_server(databases, tmp_path_factory):
    # The worker's interval is long: only the command collects here.
    proc = ServerProcess(databases.create(), tmp_path_factory.mktemp("gc"),
                         extra_env={"CONTENTSVC_UPLOAD_URL_TTL": str(UPLOAD_TTL), "CONTENTSVC_GC_INTERVAL": "3600",
                                    "CONTENTSVC_GC_RETIRED_GENERATION_GRACE": "1"})
    yield proc
    proc.stop()


def test_gc_deletes_a_retired_generation_and_an_unreferenced_blob_and_keeps_the_rest(gc_server):
    server = gc_server
    org = f"org-{uuid.uuid4().hex[:8]}"
    with client_for(server, key_for(server.database_url, org)) as client:
        corpus = create_corpus(client)
        receipt = wait_current(client, ingest_resolved(client, text_command(corpus, "r1",
                                                                            "pelicans gather at the harbour")))
        assert receipt["outcome"] == "created"
        referenced = verified_blob(client, b"a referenced blob about albatrosses")
        unreferenced = verified_blob(client, b"a blob nobody references")
        assert ingest_resolved(client, blob_command(corpus, "b1", referenced["blob_id"], "text/plain"))["outcome"] \
            == "created"
        referenced_file = blob_file(server, server.database_url, referenced["blob_id"])
        unreferenced_file = blob_file(server, server.database_url, unreferenced["blob_id"])
        assert referenced_file.is_file() and unreferenced_file.is_file()

        # A replay builds a new lexical generation and retires the serving one.
        before = generation_dirs(server, "lexical")
        done = cli(server, "projector", "replay", "lexical")
        assert done.returncode == 0, done.stderr
        after = generation_dirs(server, "lexical")
        (retired,) = [gid for gid, (state, _) in after.items() if state == "retired" and gid in before]
        (serving,) = [gid for gid, (state, _) in after.items() if state == "serving"]
        assert after[retired][1].is_dir() and after[serving][1].is_dir()

        # projector status: bytes held per generation, the retired one while its files remain.
        status = cli(server, "projector", "status")
        assert status.returncode == 0, status.stderr
        rows = {row["generation"]: row for row in status_table_rows(status.stdout)}
        assert f"{retired} (retired)" in rows and f"{serving} (serving)" in rows, status.stdout
        assert int(rows[f"{retired} (retired)"]["bytes"]) > 0

        wait_expired(unreferenced)
        time.sleep(1.1)  # the generation grace (1 s) passes too

        # --dry-run lists what would go and deletes nothing.
        dry = cli(server, "gc", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert retired in dry.stdout and unreferenced["blob_id"] in dry.stdout, dry.stdout
        assert referenced["blob_id"] not in dry.stdout and serving not in dry.stdout
        assert after[retired][1].is_dir() and unreferenced_file.is_file()
        assert client.get(f"/v0/blobs/{unreferenced['blob_id']}").status_code == 200

        gc = cli(server, "gc")
        assert gc.returncode == 0, gc.stderr
        assert f"removed generation lexical/{retired}" in gc.stdout, gc.stdout
        assert f"removed blob {unreferenced['blob_id']}" in gc.stdout
        assert "bytes freed" in gc.stdout and referenced["blob_id"] not in gc.stdout
        assert not after[retired][1].exists() and after[serving][1].is_dir()
        assert not unreferenced_file.exists() and referenced_file.is_file()

        # Search still answers from the serving generation.
        assert [h["record_id"] for h in search_hits(client, "pelicans", corpus)] == [receipt["record_id"]]
        # part 1 rule 8: a collected Blob is not found; rule 7: referencing it is unverified_blob.
        assert_error(client.get(f"/v0/blobs/{unreferenced['blob_id']}"), 404, "not_found")
        r = client.post("/v0/records", json=blob_command(corpus, "b2", unreferenced["blob_id"], "text/plain"))
        assert_error(r, 422, "unverified_blob")
        # The referenced Blob stays: metadata and bytes, and a new reference is accepted.
        assert client.get(f"/v0/blobs/{referenced['blob_id']}").status_code == 200
        assert ingest_resolved(client, blob_command(corpus, "b3", referenced["blob_id"], "text/plain"))["outcome"] \
            == "created"

        # A second pass finds nothing more; the status no longer lists the deleted generation.
        again = cli(server, "gc")
        assert again.returncode == 0, again.stderr
        assert "removed 0 generation(s), 0 blob(s), 0 unconfirmed upload(s), 0 blob file(s)" in again.stdout
        status = cli(server, "projector", "status")
        assert retired not in status.stdout and serving in status.stdout


def test_the_same_content_uploaded_again_keeps_its_bytes(gc_server):
    # Content-addressed bytes shared by a collected Blob and a referenced one stay for the latter.
    server = gc_server
    org = f"org-{uuid.uuid4().hex[:8]}"
    data = f"shared content {uuid.uuid4().hex}".encode()
    with client_for(server, key_for(server.database_url, org)) as client:
        corpus = create_corpus(client)
        first = verified_blob(client, data)
        second = verified_blob(client, data)
        assert ingest_resolved(client, blob_command(corpus, "s", second["blob_id"], "text/plain"))["outcome"] \
            == "created"
        path = blob_file(server, server.database_url, second["blob_id"])
        assert path == blob_file(server, server.database_url, first["blob_id"])
        wait_expired(second)
        gc = cli(server, "gc")
        assert gc.returncode == 0, gc.stderr
        assert f"removed blob {first['blob_id']}" in gc.stdout and second["blob_id"] not in gc.stdout
        assert path.read_bytes() == data  # the referenced Blob still holds the same bytes
        assert client.get(f"/v0/blobs/{second['blob_id']}").status_code == 200
        assert_error(client.get(f"/v0/blobs/{first['blob_id']}"), 404, "not_found")


def test_bytes_received_but_never_confirmed_go_at_the_upload_expiry(gc_server):
    # part 1 rule 7: a session has an expiry; bytes PUT but never confirmed do not outlive it.
    server = gc_server
    org = f"org-{uuid.uuid4().hex[:8]}"
    data = f"never confirmed {uuid.uuid4().hex}".encode()
    with client_for(server, key_for(server.database_url, org)) as client:
        upload = create_upload(client, data)
        assert put_content(upload, data).status_code == 200  # state verifying
        path = server.home / "blobs" / "sha256" / sha(data)[:2] / sha(data)[2:4] / sha(data)
        assert path.is_file()
        wait_expired(upload)
        dry = cli(server, "gc", "--dry-run")
        assert dry.returncode == 0 and upload["upload_id"] in dry.stdout and path.is_file(), dry.stdout
        gc = cli(server, "gc")
        assert gc.returncode == 0, gc.stderr
        assert f"removed upload {upload['upload_id']}" in gc.stdout and not path.exists(), gc.stdout
        # A late confirm observes the failure instead of verifying bytes that are gone.
        failed = confirm(client, upload["upload_id"])
        assert failed["state"] == "failed" and failed["error"]["code"] == "upload_expired"


def test_the_gc_worker_collects_on_its_own(databases, tmp_path):
    # The periodic worker of the process registry does what `contentsvc gc` does, within a bounded wait.
    server = ServerProcess(databases.create(), tmp_path,
                           extra_env={"CONTENTSVC_UPLOAD_URL_TTL": str(UPLOAD_TTL), "CONTENTSVC_GC_INTERVAL": "1",
                                      "CONTENTSVC_GC_RETIRED_GENERATION_GRACE": "1"})
    try:
        org = f"org-{uuid.uuid4().hex[:8]}"
        with client_for(server, key_for(server.database_url, org)) as client:
            corpus = create_corpus(client)
            receipt = wait_current(client, ingest_resolved(client, text_command(corpus, "r1",
                                                                                "cormorants dive for fish")))
            blob = verified_blob(client, b"left behind by a client")
            path = blob_file(server, server.database_url, blob["blob_id"])
            done = cli(server, "projector", "replay", "lexical")
            assert done.returncode == 0, done.stderr
            (retired,) = [p for state, p in generation_dirs(server, "lexical").values() if state == "retired"]
            deadline = time.time() + 30
            while retired.exists() or path.exists():
                assert time.time() < deadline, f"gc worker left {retired} or {path}:\n{server.tail()}"
                time.sleep(0.25)
            assert_error(client.get(f"/v0/blobs/{blob['blob_id']}"), 404, "not_found")
            assert [h["record_id"] for h in search_hits(client, "cormorants", corpus)] == [receipt["record_id"]]
    finally:
        server.stop()
