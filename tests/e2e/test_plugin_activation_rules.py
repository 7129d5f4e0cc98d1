"""Activation keeps the startup rules (part 2 "Activation rules"; decisions-part2 "Activation,
plans, rollback"), through `POST /v0/admin/plugins/{registration_id}/activate` on a real server
(`contentsvc run`, whose `plugins` worker runs the contract check) with real plugin processes
serving manifests that declare ingestion and retrieval contributions
(tests/fixtures/plugins/stub_provider). The deployment runs without the embedding model, so a
current Version stays without its primary vectors until it is withdrawn. The registry is
deployment-wide: the module has its own database."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, key_for, text_command, \
    wait_current, wait_resolved
from tests.e2e.test_plugin_admin import operator_key, registration, wait_state
from tests.e2e.test_records import withdraw, withdrawal
from tests.integration.plugin_processes import PluginProcess

STUB = "tests.fixtures.plugins.stub_provider.plugin"


def manifest(plugin_id: str, version: str, spaces: list[tuple[str, str]] = (), formats: list[str] = (),
             profiles: list[str] = ()) -> str:
    """A manifest (decisions-part2 "Manifest file") with an ingestion contribution of `spaces`
    (name, model; 8 dimensions, cosine) and `formats`, and a retrieval contribution of `profiles`."""
    contributions: dict = {}
    if spaces:
        contributions["ingestion"] = {
            "spaces": [{"name": name, "model": model, "dimensions": 8, "metric": "cosine", "modalities": ["text"]}
                       for name, model in spaces], "source_formats": list(formats)}
    if profiles:
        contributions["retrieval"] = {"profiles": [{"name": p, "version": "1", "modes": ["hybrid"],
                                                    "max_latency_ms": 1000, "max_query_chars": 1000}
                                                   for p in profiles]}
    return json.dumps({"manifest_version": 1, "id": plugin_id, "version": version, "plugin_api": "0.7",
                       "title": f"{plugin_id} {version}", "contributions": contributions}, indent=2)


class Provider:
    """A stub plugin process serving one manifest, and its validated registration."""

    def __init__(self, admin: httpx.Client, tmp_path: Path, text: str):
        self.folder = tmp_path / f"plugin-{uuid.uuid4().hex[:8]}"
        (self.folder / "fixtures").mkdir(parents=True)
        (self.folder / "contentsvc-plugin.json").write_text(text)
        self.process = PluginProcess(json.loads(text)["id"], tmp_path, module=STUB, args=(str(self.folder),))
        created = admin.post("/v0/admin/plugins", json=registration(self.process, self.folder, uuid.uuid4().hex))
        assert created.status_code == 202, created.text
        checked = wait_state(admin, created.json()["registration_id"], ("validated", "rejected"))
        assert checked["state"] == "validated", checked["check"]  # no fixture is needed for these contributions
        self.registration_id = checked["registration_id"]

    def activate(self, admin: httpx.Client) -> httpx.Response:
        return admin.post(f"/v0/admin/plugins/{self.registration_id}/activate",
                          json={"idempotency_key": uuid.uuid4().hex})

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("activation-rules")
    (folder / "no-model").mkdir()
    config = folder / "contentsvc.toml"
    config.write_text(f'[search]\nmodel_dir = "{folder / "no-model"}"\n')
    server = ServerProcess(databases.create(), folder, {"CONTENTSVC_CONFIG": str(config)})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin(deployment):
    with httpx.Client(base_url=deployment.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {operator_key(deployment.database_url)}"}) as client:
        yield client


def refused(response: httpx.Response) -> str:
    return assert_error(response, 409, "plugin_conflict")["message"]


def test_activation_refuses_what_breaks_a_startup_rule_and_leaves_the_plan(deployment, admin, tmp_path):
    providers: list[Provider] = []

    def provider(*args, **kwargs) -> Provider:
        providers.append(Provider(admin, tmp_path, manifest(*args, **kwargs)))
        return providers[-1]

    try:
        # A current Version without its primary vectors (the model is missing: it waits for them).
        with client_for(deployment, key_for(deployment.database_url, "org-coverage")) as api:
            corpus = create_corpus(api)
            receipt = api.post("/v0/records", json=text_command(corpus, "waiting", "Harbour cranes.")).json()
            wait_current(api, wait_resolved(api, receipt["receipt_id"]))

            embedder = provider("embedder", "1.0.0", [("docs", "model-a")], ["text/plain"], ["editorial"])
            # part 2: changing the ingestion plugin serving a source format (here: giving text/plain one)
            # requires complete primary-vector coverage of every current Version; refusal leaves the plan
            message = refused(embedder.activate(admin))
            assert "primary-vector coverage" in message and "text/plain" in message and "1 current Version" in message
            assert_error(admin.get("/v0/admin/plugins/plan"), 404, "not_found")
            assert admin.get(f"/v0/admin/plugins/{embedder.registration_id}").json()["state"] == "validated"

            # once the Version is no longer current, coverage is complete
            wait_resolved(api, withdraw(api, withdrawal(corpus, "waiting"))["receipt_id"])
        activated = embedder.activate(admin)
        assert activated.status_code == 200, activated.text
        plan = activated.json()
        assert [r["role"] for r in plan["roles"]] == ["ingestion:docs", "retrieval:editorial"]

        # vector-space ownership: a model cannot change without a new space version
        remodelled = provider("embedder", "2.0.0", [("docs", "model-b")], ["text/plain"], ["editorial"])
        message = refused(remodelled.activate(admin))
        assert message.count("vector-space ownership") == 1 and "space docs" in message and "model-b" in message
        # ... the engine's own space too (part 1 "Corpus vector space": owner engine or an ingestion plugin);
        # and one ingestion plugin per source format (valid ingestion source routes)
        rival = provider("rival", "1.0.0", [("minilm_l6_v2", "model-c")], ["text/plain"])
        message = refused(rival.activate(admin))
        assert "vector-space ownership: space minilm_l6_v2" in message
        assert "valid ingestion source routes" in message and "source format text/plain" in message
        # an activation replaces only the retrieval provider with the same plugin id
        ranker = provider("ranker", "1.0.0", profiles=["editorial"])
        message = refused(ranker.activate(admin))
        assert "retrieval providers per plugin id: retrieval:editorial is served by embedder 1.0.0" in message
        assert "an activation replaces only the retrieval provider with the same plugin id" in message
        assert admin.get("/v0/admin/plugins/plan").json() == plan  # every refusal left the plan unchanged

        # a new space version (a new name), served by the same plugin id, replaces its retrieval provider
        renamed = provider("embedder", "2.1.0", [("docs_v2", "model-b")], ["text/plain"], ["editorial"])
        newer = renamed.activate(admin)
        assert newer.status_code == 200, newer.text
        assert {r["role"]: r["version"] for r in newer.json()["roles"]} == {
            "ingestion:docs_v2": "2.1.0", "retrieval:editorial": "2.1.0"}
        # the space docs left the plan, its vectors stay: it still keeps its model
        assert "space docs" in refused(remodelled.activate(admin))
    finally:
        for each in providers:
            each.stop()
