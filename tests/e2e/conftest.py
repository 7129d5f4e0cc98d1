"""A deployment for the monitoring tests: `contentsvc run` with a contentsvc.toml that pins the
first-party fixture evaluator (launched by the supervisor, decisions-part2 `launch`) and one
loopback webhook destination (decisions-part2 `[destinations.*]`)."""

from __future__ import annotations

import base64
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from contentsvc.processes.local_service import free_port

from tests.conftest import ServerProcess, client_for, create_corpus, key_for

EVALUATOR = Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins" / "fixture_evaluator"
EVALUATOR_VERSION = "0.1.0"
DESTINATION = "hooks"


@dataclass
class Monitoring:
    server: ServerProcess
    url: str  # its database

    def key(self, org: str, actions: str = "*", corpora: str = "*") -> str:
        return key_for(self.url, org, actions, corpora)

    def client(self, org: str, actions: str = "*", corpora: str = "*") -> httpx.Client:
        return client_for(self.server, self.key(org, actions, corpora))


def start_monitoring(databases, folder: Path, destination_url: str | None = None, secret: str | None = None,
                     extra_toml: str = "", evaluator_endpoint: str | None = None) -> Monitoring:
    """`contentsvc run` on a database of its own, pinning the fixture evaluator (launched by the run,
    or the build already listening at `evaluator_endpoint`), with the destination DESTINATION at
    `destination_url` (default: a loopback port nobody listens on) and any further startup-file
    sections."""
    (folder / "fixture-evaluator").mkdir()
    shutil.copy(EVALUATOR / "contentsvc-plugin.json", folder / "fixture-evaluator")
    secret = secret or "whsec_" + base64.b64encode(os.urandom(32)).decode()
    destination_url = destination_url or f"http://127.0.0.1:{free_port()}/hooks"
    endpoint = evaluator_endpoint or f"http://127.0.0.1:{free_port()}"
    config = folder / "contentsvc.toml"
    config.write_text(
        f'[plugins.fixture-evaluator]\nendpoint = "{endpoint}"\n'
        f'version = "{EVALUATOR_VERSION}"\nmanifest = "fixture-evaluator/contentsvc-plugin.json"\n'
        + ('' if evaluator_endpoint else 'launch = "fixture-evaluator"\n') +
        f'\n[destinations.{DESTINATION}]\nurl = "{destination_url}"\nsecret = "{secret}"\n\n{extra_toml}')
    url = databases.create()
    return Monitoring(ServerProcess(url, folder, {"CONTENTSVC_CONFIG": str(config)}), url)


@pytest.fixture(scope="module")  # stopped with its module, as conftest's replay_server is
def monitoring(databases, tmp_path_factory):
    deployment = start_monitoring(databases, tmp_path_factory.mktemp("monitoring"))
    yield deployment
    deployment.server.stop()


def new_org() -> str:
    return f"org-{uuid.uuid4().hex[:8]}"


def corpora(client: httpx.Client, n: int) -> list[str]:
    return [create_corpus(client, f"mon-{uuid.uuid4().hex[:8]}") for _ in range(n)]


def saved_query(client: httpx.Client, corpus_ids: list[str], expression: dict | None = None,
                name: str = "Cranes") -> dict:
    r = client.post("/v0/saved-queries", json={"idempotency_key": uuid.uuid4().hex, "name": name,
                                                "corpus_ids": corpus_ids,
                                                "expression": expression or {"contains": "crane"}})
    assert r.status_code == 201, r.text
    return r.json()


def subscription_body(version_id: str, **extra) -> dict:
    return {"idempotency_key": uuid.uuid4().hex, "name": "Crane alerts", "saved_query_version_id": version_id,
            "evaluator": {"plugin_id": "fixture-evaluator", "version": EVALUATOR_VERSION, "configuration": {}},
            "destination_id": DESTINATION, **extra}


def version_body(version_id: str, **extra) -> dict:
    """A create-version request: part 2 Subscription Version lists no name or owner."""
    body = subscription_body(version_id, **extra)
    del body["name"]
    return body


def changes(client: httpx.Client, corpus_id: str, cursor: str) -> tuple[list[dict], str]:
    r = client.get("/v0/changes", params={"corpus_id": corpus_id, "cursor": cursor, "limit": 1000})
    assert r.status_code == 200, r.text
    return r.json()["items"], r.json()["next_cursor"]


def feed_start(client: httpx.Client, corpus_id: str) -> str:
    r = client.get("/v0/changes", params={"corpus_id": corpus_id})
    assert r.status_code == 200, r.text
    return r.json()["next_cursor"]


def kinds_until(client: httpx.Client, corpus_id: str, cursor: str, expected: list[str], timeout: float = 20) -> list[dict]:
    """The monitoring change events after `cursor` once the feed (published as the readmodel
    projector folds) shows `expected` of them; bounded by a deadline."""
    import time

    deadline = time.time() + timeout
    seen: list[dict] = []
    while True:
        items, cursor = changes(client, corpus_id, cursor)
        seen += [e for e in items if e["kind"].split(".")[0] in ("saved_query", "subscription")]
        if [e["kind"] for e in seen] == expected or time.time() > deadline:
            return seen
        time.sleep(0.1)
