"""A full disk under the blob store, over real HTTP against a real `contentsvc run` process.

The blob store's folder is a real tmpfs too small for the Upload, so the PUT's writes fail with
ENOSPC as they would on a full disk. part1 "Error" table: a dependency that is unavailable is
503 `storage_unavailable`, retry later, never a 500. Nothing of the body is kept, the Upload
still awaits its bytes, and the same PUT succeeds once there is room. Mounting needs root
(CAP_SYS_ADMIN); elsewhere the test is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from tests.conftest import ServerProcess, assert_error, client_for
from tests.e2e.test_uploads import confirm, create_upload, get_upload, put_content, wait_state


def _mount_tmpfs(path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_put_onto_a_full_disk_is_503_storage_unavailable_and_succeeds_again_once_there_is_room(
        database_url, make_key, tmp_path):
    home = tmp_path / "home"
    blobs = home / "blobs"
    if os.geteuid() != 0 or not _mount_tmpfs(blobs, "1m"):
        pytest.skip("mounting a small tmpfs under the blob store needs root (CAP_SYS_ADMIN)")
    server = None
    try:
        server = ServerProcess(database_url, tmp_path, home=home)
        data = os.urandom(3 * 1024 * 1024)  # three times the room there is
        with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as client:
            upload = create_upload(client, data)

            r = put_content(upload, data)
            err = assert_error(r, 503, "storage_unavailable")  # part1 Error table: dependency unavailable
            assert err["retryable"] is True and "no space left" in err["message"]
            assert int(r.headers["Retry-After"]) >= 1
            assert list((blobs / "incoming").iterdir()) == []  # the partial file is gone
            assert get_upload(client, upload["upload_id"])["state"] == "awaiting_upload"

            logged = [json.loads(line) for line in server.log_path.read_text().splitlines() if line.startswith("{")]
            full = [e for e in logged if e.get("event") == "blob_store_unwritable"]
            assert full and full[0]["error"] == "ENOSPC" and full[0]["upload_id"] == upload["upload_id"]
            assert not [e for e in logged if e.get("event") == "unhandled_error"]

            # The operator makes room: the same presigned PUT now stores the bytes (part1 rule 7).
            subprocess.run(["mount", "-o", "remount,size=16m", str(blobs)], check=True)
            r = put_content(upload, data)
            assert r.status_code == 200, r.text
            confirm(client, upload["upload_id"])
            assert wait_state(client, upload["upload_id"], {"verified", "failed"})["state"] == "verified"
            assert client.get(f"/v0/blobs/{upload['blob_id']}").status_code == 200
    finally:
        if server is not None:
            server.stop()
        subprocess.run(["umount", str(blobs)], capture_output=True)
