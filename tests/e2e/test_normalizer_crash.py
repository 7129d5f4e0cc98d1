"""The process calling a normalizer dies mid-call (SIGKILL): `contentsvc run` restarts it, the
normalizer is called again with the same idempotency key and a new invocation id, and the Record
gets exactly one Version (part 2 normalizer request: `idempotency_key` stable across retries,
`invocation_id` unique per attempt; part 1 rule 18, the change feed shows each fact once)."""

from __future__ import annotations

import os
import signal
import time
import uuid


from tests.conftest import ServerProcess, client_for, create_corpus, key_for, wait_resolved
from tests.e2e.test_changes import for_receipt, poll_until, resolved_all, start_now
from tests.e2e.test_normalizer_diagnostics import REQUIRED, pin_misbehaving
from tests.e2e.test_uploads import blob_command, verified_blob, version_of
from tests.fixtures.plugins.misbehaving.plugin import MARKER_DIR_VARIABLE, SLOW_ONCE_MARKER, calls
from tests.integration.plugin_processes import PluginProcess

BOUND_S = 60


def materializer_pid(server: ServerProcess) -> int | None:
    """The supervised child running the materializer (`contentsvc projector run materializer`)."""
    child = server.children().get("projector:materializer")
    return child.pid if child is not None else None


def test_a_materializer_killed_mid_call_calls_again_with_the_same_key_and_makes_one_version(databases, tmp_path):
    marker_dir = tmp_path / "markers"
    marker_dir.mkdir()
    plugin = PluginProcess("misbehaving", tmp_path, module="tests.fixtures.plugins.misbehaving.plugin",
                           extra_env={MARKER_DIR_VARIABLE: str(marker_dir)})
    url = databases.create()
    server = ServerProcess(url, tmp_path, {"CONTENTSVC_CONFIG": str(pin_misbehaving(tmp_path, plugin.port))})
    try:
        client = client_for(server, key_for(url, "org-crash"))
        corpus = create_corpus(client, f"crash-{uuid.uuid4().hex[:8]}")
        cursor = start_now(client, corpus)
        data = b"slow-once\nthe text that outlived a crash\n"
        blob_id = verified_blob(client, data, REQUIRED)["blob_id"]
        r = client.post("/v0/records", json=blob_command(corpus, "crash", blob_id, REQUIRED))
        assert r.status_code == 202, r.text
        receipt_id = r.json()["receipt_id"]

        # The plugin holds its first call (within the manifest's timeout) once it has written the marker.
        deadline = time.time() + BOUND_S
        while time.time() < deadline and not list(marker_dir.glob(f"{SLOW_ONCE_MARKER}.*")):
            time.sleep(0.02)
        assert list(marker_dir.glob(f"{SLOW_ONCE_MARKER}.*")), "the normalizer was never called"
        killed = materializer_pid(server)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)

        # the supervisor restarts it (src/contentsvc/processes/supervisor.py: a dead child is restarted)
        deadline = time.time() + BOUND_S
        while time.time() < deadline and materializer_pid(server) in (None, killed):
            time.sleep(0.05)
        assert materializer_pid(server) not in (None, killed)

        receipt = wait_resolved(client, receipt_id, timeout=BOUND_S)
        assert receipt["outcome"] == "created" and receipt["diagnostics"] == [], receipt
        parts = version_of(client, receipt)["manifest"]["parts"]
        assert [p["content"]["text"] for p in parts] == ["the text that outlived a crash"], parts

        # exactly one Version: one record.accepted for the Record, the one the Receipt names
        events, _ = poll_until(client, corpus, cursor, resolved_all([receipt_id]), timeout=BOUND_S)
        accepted = [e for e in events if e["kind"] == "record.accepted"]
        assert [(e["subject"]["id"], e["version_id"]) for e in accepted] == \
            [(receipt["record_id"], receipt["version_id"])], events
        assert [e["kind"] for e in for_receipt(events, receipt_id)].count("receipt.resolved") == 1

        # two calls: the one cut short and the one after the restart, same key, new invocation id
        made = [(key, invocation_id) for key, invocation_id, first_line in calls(marker_dir)
                if first_line == "slow-once"]
        assert len(made) == 2, made
        assert made[0][0] == made[1][0] and made[0][1] != made[1][1], made
    finally:
        server.stop()
        plugin.stop()
    assert "Traceback" not in server.log_path.read_text(errors="replace")
