"""Attachments of connector items end to end (part 2 plugin protocol `describe_attachment`,
`upload_attachment`; decisions-part2 kind `attachments {max_bytes}`): a real plugin process
describes each attachment and uploads its bytes to the presigned grant of an Upload the core made;
the item's Version then holds the Blob as a Part and is searchable once normalized."""

from __future__ import annotations

import shutil
import uuid

import psycopg
import pytest

from tests.conftest import ServerProcess, client_for, create_corpus, key_for, until
from tests.integration.plugin_processes import TEST_PLUGINS, PluginProcess

PLUGIN = TEST_PLUGINS / "attachment_connector"


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("attachments")
    plugin = PluginProcess("papers", folder, module="tests.fixtures.plugins.attachment_connector.plugin")
    (folder / "papers").mkdir()
    shutil.copy(PLUGIN / "contentsvc-plugin.json", folder / "papers")
    config = folder / "contentsvc.toml"
    config.write_text(f'[plugins.papers]\nendpoint = "{plugin.base_url}"\nversion = "1.0.0"\n'
                      f'manifest = "papers/contentsvc-plugin.json"\n\n[connectors]\ninterval_floor_seconds = 1\n')
    url = databases.create()
    server = ServerProcess(url, folder, {"CONTENTSVC_CONFIG": str(config)})
    yield server, url
    server.stop()
    plugin.stop()


def papers(deployment, items: list[dict], **config) -> tuple:
    server, url = deployment
    c = client_for(server, key_for(url, f"org_{uuid.uuid4().hex[:8]}"))
    corpus = create_corpus(c)
    r = c.post("/v0/connectors", json={"idempotency_key": uuid.uuid4().hex, "corpus_id": corpus,
                                       "source_namespace": "papers", "kind": "papers",
                                       "config": {"items": items, **config},
                                       "schedule": {"interval_seconds": 3600}})
    assert r.status_code == 201, r.text
    return c, corpus, r.json()["connector_id"]


def runs_ended(c, connector_id: str, count: int) -> list[dict]:
    def ended():
        items = c.get(f"/v0/connectors/{connector_id}/runs").json()["items"]
        return items if sum(r["state"] in ("succeeded", "failed") for r in items) >= count else None
    return until(ended, f"{count} ended runs of {connector_id}", timeout=30)


def test_an_attachment_becomes_a_blob_part_of_its_version_uploaded_once(deployment):
    notes = "# Keeper's notes\n\nThe foghorn sounds at dusk across the harbour."
    c, corpus, cid = papers(deployment, [{"record_key": "p1", "revision": "1", "text": "A lighthouse paper",
                                          "attachments": [
                                              {"key": "notes", "role": "attachment", "media_type": "text/markdown",
                                               "text": notes},
                                              {"key": "scan", "role": "attachment", "media_type": "text/markdown",
                                               "text": "never read", "skip": "too_large"}]}])
    [run] = runs_ended(c, cid, 1)
    assert (run["state"], run["receipts_created"], run["items_rejected"]) == ("succeeded", 1, 0), run
    found = until(lambda: c.post("/v0/search", json={"query": "foghorn", "corpus_ids": [corpus],
                                                     "mode": "lexical"}).json()["items"] or None,
                  "the attachment's text searchable")
    version = c.get(f"/v0/records/{found[0]['record_id']}/versions/{found[0]['version_id']}").json()
    parts = {p["key"]: p for p in version["manifest"]["parts"]}
    assert set(parts) == {"body", "notes"}, version["manifest"]  # the skipped attachment is no Part
    # The Blob Part, normalized as a client's Markdown upload would be: its text, under its own key and role.
    assert parts["notes"]["role"] == "attachment" and "foghorn" in parts["notes"]["content"]["text"]

    # The same item read again is the same command: the Upload is found verified, nothing is
    # uploaded twice and no second Version is made.
    r = c.post(f"/v0/connectors/{cid}/runs", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    latest = runs_ended(c, cid, 2)[0]
    assert (latest["state"], latest["receipts_created"], latest["items_rejected"]) == ("succeeded", 0, 0), latest


def test_bytes_other_than_the_described_ones_fail_the_run_as_attachment_changed(deployment):
    c, _, cid = papers(deployment, [{"record_key": "p2", "revision": "1", "text": "A changing paper",
                                     "attachments": [{"key": "notes", "role": "attachment",
                                                      "media_type": "text/markdown", "text": "described bytes",
                                                      "uploaded_text": "DESCRIBED BYTES"}]}])
    [run] = runs_ended(c, cid, 1)
    assert run["state"] == "failed" and run["error"]["code"] == "attachment_changed", run
    assert c.get(f"/v0/connectors/{cid}").json()["health"]["last_error"]["code"] == "attachment_changed"


def test_a_retry_after_in_an_answer_or_an_error_defers_the_next_run_by_at_most_a_day(deployment):
    # decisions-part2 fetch response: top level `retry_after_seconds` (integer >= 1) defers the next
    # run; so does a connector error's. The service keeps at most a day of it (docs/decisions.md):
    # a wait past an integer's range once failed the run's last update and left the run `running`.
    _, url = deployment
    waits = {}
    for name, config in (("answer", {"retry_after_seconds": 600}), ("error", {"fail_retry_after_seconds": 10 ** 12})):
        c, _, cid = papers(deployment, [{"record_key": "p3", "revision": "1", "text": "A paper"}], **config)
        [run] = runs_ended(c, cid, 1)
        assert run["state"] == ("succeeded" if name == "answer" else "failed"), run
        with psycopg.connect(url) as conn:
            waits[name] = conn.execute("SELECT extract(epoch FROM retry_after_until - now())"
                                       " FROM connectors WHERE connector_id = %s", (cid,)).fetchone()[0]
    assert 500 < waits["answer"] <= 600 and 86300 < waits["error"] <= 86400, waits
