"""part1 Diagnostic `normalizer_unrouted`: a Blob accepted while the active plan routed its media
type, materialized after a rollback left a plan that no longer routes it, and not `text/*` (the
built-in text path cannot read it): the Version is quarantined.

To make "after" certain, the materializer process is stopped (SIGSTOP) before the ingest and
continued (SIGCONT) once the rollback is committed and its plan poll is due."""

from __future__ import annotations

import time
import uuid

from tests.conftest import ServerProcess, client_for, create_corpus, key_for, suspend_caught_up, wait_resolved
from tests.e2e.test_normalizer_diagnostics import MISBEHAVING, OPTIONAL, REQUIRED
from tests.e2e.test_plugin_admin import fixtures_of, operator_key, registration, wait_state
from tests.e2e.test_uploads import blob_command, verified_blob, version_of
from tests.integration.plugin_processes import PluginProcess

PLAN_POLL_S = 0.2  # decisions-part2 `plugin_plan_poll` (0.2..60): how soon a process sees a new plan


def test_a_blob_whose_route_a_rollback_removed_is_quarantined_as_normalizer_unrouted(databases, tmp_path):
    plugin = PluginProcess("misbehaving", tmp_path, module="tests.fixtures.plugins.misbehaving.plugin")
    url = databases.create()
    server = ServerProcess(url, tmp_path, {"CONTENTSVC_PLUGIN_PLAN_POLL": str(PLAN_POLL_S)})
    stopped = None
    try:
        admin = client_for(server, operator_key(url))
        # Two registrations of the plugin: one routing both media types, one routing only text/x-misbehave
        # (decisions-part2 installed settings `routes`; each with the fixtures of its routes).
        text_only = [f for f in fixtures_of(MISBEHAVING / "fixtures") if f["path"].startswith("ok-text.")]
        bodies = [registration(plugin, MISBEHAVING, "both"),
                  registration(plugin, MISBEHAVING, "text-only", fixtures=text_only,
                               settings={"routes": [{"media_type": OPTIONAL}]})]
        ids = []
        for body in bodies:
            r = admin.post("/v0/admin/plugins", json=body)
            assert r.status_code == 202, r.text
            found = wait_state(admin, r.json()["registration_id"], ("validated", "rejected"))
            assert found["state"] == "validated", found
            ids.append(found["registration_id"])
        # decisions-part2 "Activation, plans, rollback": plans both, then text-only, then back to both
        for n, rid in enumerate(ids):
            r = admin.post(f"/v0/admin/plugins/{rid}/activate", json={"idempotency_key": f"act-{n}"})
            assert r.status_code == 200, r.text
        r = admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "back-to-both"})
        assert r.status_code == 200, r.text
        assert f"normalizer:{REQUIRED}" in {role["role"] for role in r.json()["roles"]}, r.json()

        client = client_for(server, key_for(url, "org-unrouted"))
        corpus = create_corpus(client, f"unrouted-{uuid.uuid4().hex[:8]}")
        blob_id = verified_blob(client, b"ok\nread by no route\n", REQUIRED)["blob_id"]
        stopped = suspend_caught_up(server, "materializer")
        # part 2 "Plugin registration and plan": accepted while the active plan routes the media type
        # (the API's view of the plan follows the rollback within its poll)
        deadline = time.time() + 30
        while True:
            r = client.post("/v0/records", json=blob_command(corpus, "unrouted", blob_id, REQUIRED))
            if r.status_code == 202 or time.time() > deadline:
                break
            time.sleep(PLAN_POLL_S)
        assert r.status_code == 202, r.text
        receipt_id = r.json()["receipt_id"]
        # ... and the route is gone before the materializer sees the ingest: back to the text-only plan
        r = admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "back-to-text-only"})
        assert r.status_code == 200, r.text
        assert f"normalizer:{REQUIRED}" not in {role["role"] for role in r.json()["roles"]}, r.json()
        time.sleep(3 * PLAN_POLL_S)  # the stopped materializer's plan cache is due when it continues
        stopped.resume()
        stopped = None

        receipt = wait_resolved(client, receipt_id, timeout=60)
        assert receipt["outcome"] == "created" and receipt["availability"]["state"] == "quarantined", receipt
        assert [d["code"] for d in receipt["diagnostics"]] == ["normalizer_unrouted"], receipt
        version = version_of(client, receipt)
        [diagnostic] = version["diagnostics"]
        assert diagnostic["code"] == "normalizer_unrouted" and diagnostic["retryable"] is False, diagnostic
        assert all(p["content"]["kind"] == "blob" for p in version["manifest"]["parts"])
    finally:
        if stopped is not None:
            stopped.resume()
        server.stop()
        plugin.stop()
    assert "Traceback" not in server.log_path.read_text(errors="replace")
