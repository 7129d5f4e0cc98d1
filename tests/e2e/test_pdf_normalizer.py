"""The pdf normalizer as a user runs it (decisions-part2 "Startup configuration", `launch`; part 2
"Normalizer request"; part 1 "Diagnostic"): `contentsvc run` with a contentsvc.toml pinning the
first-party pdf plugin for application/pdf starts the plugin itself; a PDF Blob becomes a Version
whose Parts are the PDF's pages, found by lexical search; bytes that are not a PDF quarantine the
Version with the plugin's terminal error as `normalizer_failed`, naming plugin, contribution and
invocation; one needing more CPU than the pin's configuration allows is refused as
`pdf_limit_exceeded`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from contentsvc.processes.local_service import free_port

from tests.conftest import ServerProcess, client_for, create_corpus, key_for, wait_healthy, wait_resolved
from tests.e2e.test_plugin_admin import PDF
from tests.e2e.test_uploads import blob_command, verified_blob, version_of
from tests.fixtures.plugins.make_pdf import long_report

FIXTURE = PDF / "fixtures" / "inspection.pdf"


def _searchable(client: httpx.Client, receipt: dict, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    while not receipt["availability"]["searchable"] and time.time() < deadline:
        time.sleep(0.1)
        receipt = client.get(f"/v0/ingestion-receipts/{receipt['receipt_id']}").json()
    return receipt


def _ingest(client: httpx.Client, corpus: str, key: str, blob_id: str) -> dict:
    r = client.post("/v0/records", json=blob_command(corpus, key, blob_id, "application/pdf"))
    # part 2 "Plugin registration and plan": a media type the active plan routes is accepted
    assert r.status_code == 202, r.text
    return wait_resolved(client, r.json()["receipt_id"], timeout=60)


def _pin_pdf(tmp_path, port: int, extra: str = "") -> Path:
    """A deployment folder whose contentsvc.toml pins the first-party pdf plugin at `port`
    (its manifest copied beside it); `extra` adds keys to the pin. Returns the file."""
    deploy = tmp_path / "deploy"
    (deploy / "pdf").mkdir(parents=True)
    shutil.copy(PDF / "contentsvc-plugin.json", deploy / "pdf")
    config = deploy / "contentsvc.toml"
    config.write_text(f'[plugins.pdf]\nendpoint = "http://127.0.0.1:{port}"\nversion = "0.1.0"\n'
                      f'manifest = "pdf/contentsvc-plugin.json"\n{extra}')
    return config


def test_a_launched_pdf_normalizer_turns_a_pdf_blob_into_searchable_pages(databases, tmp_path):
    port = free_port()
    config = _pin_pdf(tmp_path, port, f'token = "pdf-token-{uuid.uuid4().hex}"\nlaunch = "pdf"\n'
                                      '[plugins.pdf.configuration]\nmax_cpu_seconds = 1\n')
    url = databases.create()
    server = ServerProcess(url, tmp_path, {"CONTENTSVC_CONFIG": str(config)})
    try:
        # decisions-part2 `launch`: `contentsvc run` started the plugin on the pinned port, with the token
        # a first-party plugin started with CONTENTSVC_PLUGIN_TOKEN wants it, on /v0/health too
        wait_healthy(f"http://127.0.0.1:{port}", timeout=30, status=401)

        client = client_for(server, key_for(url, "org-pdf"))
        corpus = create_corpus(client, f"pdf-{uuid.uuid4().hex[:8]}")
        data = FIXTURE.read_bytes()
        blob = verified_blob(client, data, "application/pdf")
        receipt = _ingest(client, corpus, "inspection", blob["blob_id"])
        # part 1 rule 7 + part 2 normalizer: the Version's text Parts come from the PDF, one per page
        assert receipt["outcome"] == "created" and receipt["diagnostics"] == [], receipt
        parts = version_of(client, receipt)["manifest"]["parts"]
        pages = [p for p in parts if p["key"].startswith("page-")]
        assert [p["key"] for p in pages] == [f"page-{n}" for n in range(1, len(pages) + 1)] and len(pages) >= 2
        assert all(p["content"]["kind"] == "text" and p["role"] == "body" for p in pages)
        text = "\n".join(p["content"]["text"] for p in parts)
        assert "Harbour crane inspection" in text and "Bearings replaced" in text
        # ... searchable like any other Version (part 1 rule 19, lexical search)
        receipt = _searchable(client, receipt)
        assert receipt["availability"]["searchable"] is True, receipt
        r = client.post("/v0/search", json={"query": "bearings", "corpus_ids": [corpus], "mode": "lexical"})
        assert r.status_code == 200, r.text
        assert receipt["record_id"] in {hit["record_id"] for hit in r.json()["items"]}, r.json()

        # part 1 "Diagnostic": the plugin's terminal error quarantines the Version as normalizer_failed
        broken = b"%PDF-1.4 this is not really a PDF " + uuid.uuid4().bytes
        blob = verified_blob(client, broken, "application/pdf")
        receipt = _ingest(client, corpus, "broken", blob["blob_id"])
        assert receipt["outcome"] == "created", receipt
        [diagnostic] = receipt["diagnostics"]
        assert diagnostic["code"] == "normalizer_failed" and diagnostic["retryable"] is False
        assert diagnostic["plugin"] == "pdf" and diagnostic["contribution"] == "normalizer"
        assert diagnostic["invocation_id"].startswith("inv")
        assert "invalid_pdf" in diagnostic["message"]
        assert receipt["availability"]["state"] == "quarantined"
        # the plugin's answer is journaled as a fact: the Version's manifest is in record.accepted
        with psycopg.connect(url) as conn:
            kinds = [k for (k,) in conn.execute(
                "SELECT kind FROM journal WHERE version_id = %s ORDER BY position", (receipt["version_id"],))]
        assert "record.accepted" in kinds

        # docs/decisions.md "`pdf` bounds": the pin's configuration bounds each PDF's
        # read; a PDF needing more CPU is refused terminally, and the plugin reads the next one
        blob = verified_blob(client, long_report(), "application/pdf")
        receipt = _ingest(client, corpus, "long", blob["blob_id"])
        [diagnostic] = receipt["diagnostics"]
        assert diagnostic["code"] == "normalizer_failed" and "pdf_limit_exceeded" in diagnostic["message"], receipt
        receipt = _ingest(client, corpus, "inspection-again", verified_blob(client, data, "application/pdf")["blob_id"])
        assert receipt["diagnostics"] == [], receipt
    finally:
        server.stop()
    log = server.log_path.read_text(errors="replace")
    assert "Traceback" not in log
    assert '"plugin_invocation"' in log  # decisions-part2 "Logging": each invocation is a log line


def _serve_pdf(port: int, log_path) -> subprocess.Popen:
    """`contentsvc plugin serve pdf --port P` as an operator starts it, listening once this returns."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONTENTSVC_PLUGIN_TOKEN", "CONTENTSVC_CONFIG")}
    process = subprocess.Popen([sys.executable, "-m", "contentsvc.cli", "plugin", "serve", "pdf", "--port", str(port)],
                               stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", process, log_path, 30)  # no token: its health answers 200
    except BaseException:
        process.kill()
        raise
    return process


def test_an_unreachable_normalizer_keeps_the_receipt_pending_across_a_restart(databases, tmp_path):
    # part 1 "Diagnostic": an unreachable plugin is retried with backoff, produces no diagnostic on the
    # Version, and the Receipt shows plugin_unavailable meanwhile; decisions-part2: the work keeps its
    # plan through retries and restarts.
    port = free_port()
    config = _pin_pdf(tmp_path, port)
    url = databases.create()
    home = tmp_path / "home"
    env = {"CONTENTSVC_CONFIG": str(config)}
    server = ServerProcess(url, tmp_path, env, home=home)
    plugin = None
    try:
        client = client_for(server, key_for(url, "org-pdf"))
        corpus = create_corpus(client, f"pdf-{uuid.uuid4().hex[:8]}")
        blob = verified_blob(client, FIXTURE.read_bytes(), "application/pdf")
        r = client.post("/v0/records", json=blob_command(corpus, "later", blob["blob_id"], "application/pdf"))
        assert r.status_code == 202, r.text
        receipt_id = r.json()["receipt_id"]
        deadline = time.time() + 20
        receipt = {}
        while time.time() < deadline and not receipt.get("diagnostics"):
            receipt = client.get(f"/v0/ingestion-receipts/{receipt_id}").json()
            time.sleep(0.1)
        assert receipt["state"] == "pending" and receipt["processing"]["state"] == "retrying", receipt
        [diagnostic] = receipt["diagnostics"]
        assert diagnostic["code"] == "plugin_unavailable" and diagnostic["retryable"] is True
        assert diagnostic["plugin"] == "pdf" and str(port) not in diagnostic["message"]  # no address leaks
        # part 1 "Diagnostic" normalization_superseded: a newer revision of a waiting identity settles it
        r = client.post("/v0/records", json=blob_command(corpus, "overtaken", blob["blob_id"], "application/pdf"))
        assert r.status_code == 202, r.text
        overtaken = r.json()["receipt_id"]
        deadline = time.time() + 20
        while time.time() < deadline and client.get(f"/v0/ingestion-receipts/{overtaken}").json()[
                "processing"]["state"] != "retrying":
            time.sleep(0.1)
        newer = client.post("/v0/records", json={"idempotency_key": uuid.uuid4().hex,
                                                 "source": {"corpus_id": corpus, "namespace": "uploads",
                                                            "record_key": "overtaken"},
                                                 "content": {"kind": "text", "text": "typed out instead"}})
        assert newer.status_code == 202, newer.text
        first = wait_resolved(client, overtaken)
        assert [d["code"] for d in first["diagnostics"]] == ["normalization_superseded"], first
        assert wait_resolved(client, newer.json()["receipt_id"])["diagnostics"] == []
        with psycopg.connect(url) as conn:
            [(plan_id,)] = conn.execute("SELECT plan_id FROM materializer_deferred").fetchall()
        server.stop()

        plugin = _serve_pdf(port, tmp_path / "pdf.log")
        server = ServerProcess(url, tmp_path, env, home=home)
        client = client_for(server, key_for(url, "org-pdf"))
        receipt = wait_resolved(client, receipt_id, timeout=60)
        assert receipt["outcome"] == "created" and receipt["diagnostics"] == [], receipt
        text = "\n".join(p["content"]["text"] for p in version_of(client, receipt)["manifest"]["parts"])
        assert "Harbour crane inspection" in text
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM materializer_deferred").fetchone()[0] == 0
            [(active,)] = conn.execute("SELECT plan_id FROM plugin_plans ORDER BY created_at DESC LIMIT 1").fetchall()
        assert active == plan_id  # the work finished under the plan it started with
    finally:
        server.stop()
        if plugin is not None:
            plugin.terminate()
            plugin.wait(timeout=10)
    assert "Traceback" not in server.log_path.read_text(errors="replace")


def test_a_rollback_with_stop_quarantines_a_version_waiting_for_the_version_left(databases, tmp_path):
    # part 2 "Plugin administration": with pinned_work "stop", a Version waiting for text from the
    # version the rollback left is quarantined with pinned_plan_stopped; decisions-part2: the work
    # counts as pinned_work of that registration meanwhile.
    from tests.e2e.test_plugin_admin import operator_key, registration, wait_state
    from tests.integration.plugin_processes import PluginProcess

    url = databases.create()
    server = ServerProcess(url, tmp_path)
    first, second = PluginProcess("pdf", tmp_path), PluginProcess("pdf", tmp_path)
    try:
        admin = client_for(server, operator_key(url))
        ids = []
        for n, plugin in enumerate((first, second)):
            r = admin.post("/v0/admin/plugins", json=registration(plugin, PDF, f"pdf-{n}"))
            assert r.status_code == 202, r.text
            ids.append(wait_state(admin, r.json()["registration_id"], ("validated", "rejected"))["registration_id"])
        for n, rid in enumerate(ids):
            r = admin.post(f"/v0/admin/plugins/{rid}/activate", json={"idempotency_key": f"act-{n}"})
            assert r.status_code == 200, r.text
        second.stop()  # the active version stops answering: the Receipt waits, pinned to its plan

        client = client_for(server, key_for(url, "org-pdf"))
        corpus = create_corpus(client, f"pdf-{uuid.uuid4().hex[:8]}")
        blob = verified_blob(client, FIXTURE.read_bytes(), "application/pdf")
        r = client.post("/v0/records", json=blob_command(corpus, "stopped", blob["blob_id"], "application/pdf"))
        assert r.status_code == 202, r.text
        receipt_id = r.json()["receipt_id"]
        deadline = time.time() + 20
        while time.time() < deadline and client.get(f"/v0/ingestion-receipts/{receipt_id}").json()[
                "processing"]["state"] != "retrying":
            time.sleep(0.1)
        r = admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "rb", "pinned_work": "stop"})
        assert r.status_code == 200, r.text
        receipt = wait_resolved(client, receipt_id)
        assert receipt["outcome"] == "created" and receipt["availability"]["state"] == "quarantined", receipt
        assert [d["code"] for d in receipt["diagnostics"]] == ["pinned_plan_stopped"]
        # nothing is pinned any more: the registration the rollback left can drain to inactive
        deadline = time.time() + 20
        detail = {}
        while time.time() < deadline and detail.get("state") != "inactive":
            detail = admin.get(f"/v0/admin/plugins/{ids[1]}").json()
            time.sleep(0.2)
        assert detail["state"] == "inactive" and detail["pinned_work"] == 0, detail
    finally:
        server.stop()
        first.stop()
        second.stop()
    assert "Traceback" not in server.log_path.read_text(errors="replace")
