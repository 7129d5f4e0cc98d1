"""An activation is seen by every api process without a restart (part 2 "Plugin administration":
"each api and worker process polls for plan changes at plugin_plan_poll"; decisions-part2
"Activation, plans, rollback": every api and worker process reloads the active plan at
`plugin_plan_poll`). A second api process (`contentsvc serve`, same database and home) runs next
to `contentsvc run`; plans are made through the first, and the second accepts or refuses a PDF
Blob by the plan within the poll interval (bounded wait: the poll plus slack for a loaded machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from contentsvc.config.environment import child_environment
from contentsvc.processes.local_service import free_port
from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, key_for, wait_healthy
from tests.e2e.test_plugin_activation_rules import STUB, manifest
from tests.e2e.test_plugin_admin import PDF, operator_key, registration, wait_state
from tests.e2e.test_uploads import blob_command, verified_blob
from tests.integration.plugin_processes import PluginProcess

POLL = 0.5  # CONTENTSVC_PLUGIN_PLAN_POLL, seconds (the smallest the configuration allows is 0.2)
SLACK = 15.0  # what a loaded machine may add to a poll; the rule is the poll, the wait is bounded


class ApiProcess:
    """`contentsvc serve --no-migrate` on its own port, on a running deployment's database and home."""

    def __init__(self, database_url: str, home: Path, log_path: Path, **env: str):
        self.base_url = f"http://127.0.0.1:{free_port()}"
        self._log = open(log_path, "wb")
        self.log_path = log_path
        self.process = subprocess.Popen(
            [sys.executable, "-m", "contentsvc.cli", "serve", "--port", self.base_url.rsplit(":", 1)[1],
             "--no-migrate"], env=child_environment(CONTENTSVC_DATABASE_URL=database_url, CONTENTSVC_HOME=str(home),
                                                   **env),
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_healthy(self.base_url, self.process, log_path)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        self._log.close()


def ingest_status(api: httpx.Client, corpus: str, blob_id: str) -> httpx.Response:
    return api.post("/v0/records", json=blob_command(corpus, f"pdf-{uuid.uuid4().hex[:8]}", blob_id,
                                                     "application/pdf"))


def wait_for_status(api: httpx.Client, corpus: str, blob_id: str, status: int) -> httpx.Response:
    """The ingest answer once it is `status`, trying until the poll interval (plus slack) is over."""
    deadline = time.monotonic() + POLL + SLACK
    while True:
        answer = ingest_status(api, corpus, blob_id)
        if answer.status_code == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def test_activation_and_rollback_are_seen_by_a_second_api_process(databases, tmp_path):
    url = databases.create()
    home = tmp_path / "home"
    env = {"CONTENTSVC_PLUGIN_PLAN_POLL": str(POLL)}
    first = ServerProcess(url, tmp_path, env, home=home)
    second = ApiProcess(url, home, tmp_path / "second-api.log", **env)
    pdf = PluginProcess("pdf", tmp_path)
    ranker_folder = tmp_path / "ranker"
    (ranker_folder / "fixtures").mkdir(parents=True)
    (ranker_folder / "contentsvc-plugin.json").write_text(manifest("ranker", "1.0.0", profiles=["editorial"]))
    ranker = PluginProcess("ranker", tmp_path, module=STUB, args=(str(ranker_folder),))
    try:
        admin = httpx.Client(base_url=first.base_url, timeout=30,
                             headers={"Authorization": f"Bearer {operator_key(url)}"})
        api = client_for(second, key_for(url, "org-poll"))
        corpus = create_corpus(api)
        blob = verified_blob(api, (PDF / "fixtures" / "inspection.pdf").read_bytes(), "application/pdf")

        # A plan without a normalizer for application/pdf (a retrieval plugin only): the second api
        # process refuses the Blob, no route reads it (part 1: 422 unsupported_media_type).
        ids = {}
        for name, plugin, folder in (("ranker", ranker, ranker_folder), ("pdf", pdf, PDF)):
            created = admin.post("/v0/admin/plugins", json=registration(plugin, folder, f"{name}-poll"))
            assert created.status_code == 202, created.text
            checked = wait_state(admin, created.json()["registration_id"], ("validated", "rejected"))
            assert checked["state"] == "validated", checked["check"]
            ids[name] = checked["registration_id"]
        first_plan = admin.post(f"/v0/admin/plugins/{ids['ranker']}/activate", json={"idempotency_key": "ranker"})
        assert first_plan.status_code == 200, first_plan.text
        error = assert_error(ingest_status(api, corpus, blob["blob_id"]), 422, "unsupported_media_type")
        assert error["field"] == "/content/media_type"

        # Activation through the first process: the second accepts the Blob within the poll, no restart.
        activated = admin.post(f"/v0/admin/plugins/{ids['pdf']}/activate", json={"idempotency_key": "pdf"})
        assert activated.status_code == 200, activated.text
        assert "normalizer:application/pdf" in {r["role"] for r in activated.json()["roles"]}
        accepted = wait_for_status(api, corpus, blob["blob_id"], 202)
        assert accepted.status_code == 202, accepted.text

        # Rollback through the first process: the previous plan's roles again, and the second refuses.
        rolled = admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "back"})
        assert rolled.status_code == 200, rolled.text
        assert rolled.json()["roles"] == first_plan.json()["roles"]
        assert_error(wait_for_status(api, corpus, blob["blob_id"], 422), 422, "unsupported_media_type")
        admin.close()
        api.close()
    finally:
        for process in (ranker, pdf, second, first):
            process.stop()
    assert "Traceback" not in second.log_path.read_text(errors="replace")
