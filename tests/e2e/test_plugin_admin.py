"""Plugin registration, checking, activation, plans and rollback through the API, against a real
server (`contentsvc run`, which supervises the `plugins` worker) and real plugin processes
(`contentsvc plugin serve pdf|fixture-evaluator`). The registry is deployment-wide, so this
module runs its own server on a database of its own."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from contentsvc.auth import keys
from tests.conftest import ServerProcess, assert_error
from tests.integration.plugin_processes import PLUGINS, PluginProcess

PDF = PLUGINS / "pdf"
EVALUATOR = PLUGINS / "fixture_evaluator"


def operator_key(url: str, actions: str = "*", corpora: str = "*", operator: bool = True) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        return keys.create_key(conn, "org-operator", keys.parse_actions(actions, operator=operator),
                               keys.parse_corpora(corpora), None).secret


def fixtures_of(folder: Path) -> list[dict]:
    return [{"path": str(path.relative_to(folder)), "content_base64": base64.b64encode(path.read_bytes()).decode()}
            for path in sorted(folder.rglob("*")) if path.is_file()]


def registration(plugin: PluginProcess, folder: Path, key: str, manifest: str | None = None, **extra) -> dict:
    return {"idempotency_key": key, "manifest": manifest or (folder / "contentsvc-plugin.json").read_text(),
            "endpoint": plugin.base_url, "fixtures": fixtures_of(folder / "fixtures"), **extra}


def wait_state(admin: httpx.Client, registration_id: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = admin.get(f"/v0/admin/plugins/{registration_id}").json()
        if found["state"] in states and "check" in found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"registration still {found['state']} after {timeout} s: {found}")


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    url = databases.create()
    server = ServerProcess(url, tmp_path_factory.mktemp("plugin-admin"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin(deployment):
    with httpx.Client(base_url=deployment.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {operator_key(deployment.database_url)}"}) as client:
        yield client


@pytest.fixture(scope="module")
def pdf(tmp_path_factory):
    plugin = PluginProcess("pdf", tmp_path_factory.mktemp("pdf"))
    yield plugin
    plugin.stop()


def test_register_check_activate_and_roll_back(admin, pdf):
    # decisions-part2 "Registration request": 202 registered with Location; the worker checks it
    first = admin.post("/v0/admin/plugins", json=registration(pdf, PDF, "pdf-first"))
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["state"] == "registered" and body["plugin_id"] == "pdf" and body["version"] == "0.1.0"
    assert body["roles"] == ["normalizer:application/pdf"] and body["contributions"] == ["normalizer"]
    assert first.headers["location"] == f"/v0/admin/plugins/{body['registration_id']}"
    assert "manifest" not in body and "token" not in body

    # same key and request: the same registration; a changed request: 409 idempotency_conflict
    again = admin.post("/v0/admin/plugins", json=registration(pdf, PDF, "pdf-first"))
    assert again.status_code == 202 and again.json()["registration_id"] == body["registration_id"]
    assert_error(admin.post("/v0/admin/plugins", json=registration(pdf, PDF, "pdf-first",
                                                                  artifact_digest="sha256:" + "a" * 64)),
                 409, "idempotency_conflict")

    # part 2 states: registered -> validated when the contract check passes, every check listed
    checked = wait_state(admin, body["registration_id"], ("validated", "rejected"))
    assert checked["state"] == "validated", checked["check"]
    check = checked["check"]
    ids = [c["id"] for c in check["checks"]]
    assert ids[:7] == ["discovery.reachable", "discovery.identity", "discovery.manifest_digest",
                       "discovery.plugin_api", "discovery.contributions", "health.ok", "fixtures.present"]
    assert "normalizer.fixture" in ids and ids[-1] == "secrets.not_echoed"
    assert check["failed"] == 0 and check["passed"] == len(ids) and check["certified"] is True
    assert checked["pinned_work"] == 0

    # no plan yet: 404 (part 2: no plugin is pinned)
    assert_error(admin.get("/v0/admin/plugins/plan"), 404, "not_found")

    # activation: 200 PipelinePlan, source activation; the active plan answers the same
    activated = admin.post(f"/v0/admin/plugins/{body['registration_id']}/activate", json={"idempotency_key": "a1"})
    assert activated.status_code == 200, activated.text
    plan = activated.json()
    assert plan["source"] == "activation" and plan["plan_id"].startswith("plan_") and "previous_plan_id" not in plan
    assert plan["roles"] == [{"role": "normalizer:application/pdf", "registration_id": body["registration_id"],
                              "plugin_id": "pdf", "version": "0.1.0"}]
    assert admin.get("/v0/admin/plugins/plan").json() == plan
    assert admin.get(f"/v0/admin/plugins/{body['registration_id']}").json()["state"] == "active"
    # already active: the active plan, nothing committed
    assert admin.post(f"/v0/admin/plugins/{body['registration_id']}/activate",
                      json={"idempotency_key": "a1-again"}).json() == plan

    # a second registration of the same plugin takes over: the first leaves the plan (inactive)
    second = admin.post("/v0/admin/plugins", json=registration(pdf, PDF, "pdf-second",
                                                               artifact_digest="sha256:" + "b" * 64)).json()
    assert wait_state(admin, second["registration_id"], ("validated", "rejected"))["state"] == "validated"
    newer = admin.post(f"/v0/admin/plugins/{second['registration_id']}/activate", json={"idempotency_key": "a2"})
    assert newer.status_code == 200, newer.text
    newer = newer.json()
    assert newer["previous_plan_id"] == plan["plan_id"]
    assert newer["roles"][0]["registration_id"] == second["registration_id"]
    assert admin.get(f"/v0/admin/plugins/{body['registration_id']}").json()["state"] == "inactive"
    # the activation key replays the plan it made
    assert admin.post(f"/v0/admin/plugins/{second['registration_id']}/activate",
                      json={"idempotency_key": "a2"}).json() == newer

    # rollback: a new plan with the previous plan's roles, source rollback, previous_plan_id set
    rolled = admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "r1"})
    assert rolled.status_code == 200, rolled.text
    rolled = rolled.json()
    assert rolled["source"] == "rollback" and rolled["previous_plan_id"] == newer["plan_id"]
    assert rolled["roles"] == plan["roles"]
    assert admin.get("/v0/admin/plugins/plan").json() == rolled
    assert admin.get(f"/v0/admin/plugins/{body['registration_id']}").json()["state"] == "active"
    assert admin.get(f"/v0/admin/plugins/{second['registration_id']}").json()["state"] == "inactive"
    assert admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "r1"}).json() == rolled
    assert_error(admin.post("/v0/admin/plugins/plan/rollback", json={"idempotency_key": "r2", "plan_id": "plan_x"}),
                 404, "not_found")

    # plans newest first, in pages; one plan by id
    plans = admin.get("/v0/admin/plugins/plans").json()["items"]
    assert [p["plan_id"] for p in plans] == [rolled["plan_id"], newer["plan_id"], plan["plan_id"]]
    page = admin.get("/v0/admin/plugins/plans", params={"limit": 2}).json()
    assert len(page["items"]) == 2
    rest = admin.get("/v0/admin/plugins/plans", params={"limit": 2, "page_cursor": page["next_page_cursor"]}).json()
    assert [p["plan_id"] for p in rest["items"]] == [plan["plan_id"]] and "next_page_cursor" not in rest
    assert admin.get(f"/v0/admin/plugins/plans/{newer['plan_id']}").json() == newer
    assert_error(admin.get("/v0/admin/plugins/plans/plan_unknown"), 404, "not_found")

    listed = admin.get("/v0/admin/plugins").json()["items"]
    assert [r["registration_id"] for r in listed][:2] == [body["registration_id"], second["registration_id"]]


def test_a_build_whose_manifest_differs_is_rejected_with_digest_mismatch(admin, pdf):
    # decisions-part2 "Contract check": the plugin must report the digest of the submitted manifest
    document = json.loads((PDF / "contentsvc-plugin.json").read_text())
    document["description"] = "Another build's manifest."
    created = admin.post("/v0/admin/plugins", json=registration(pdf, PDF, "pdf-other-build",
                                                                manifest=json.dumps(document)))
    assert created.status_code == 202, created.text
    checked = wait_state(admin, created.json()["registration_id"], ("validated", "rejected"))
    assert checked["state"] == "rejected"
    [digest] = [c for c in checked["check"]["checks"] if c["id"] == "discovery.manifest_digest"]
    assert digest["status"] == "fail" and digest["issues"][0]["code"] == "digest_mismatch"
    # a rejected registration cannot be activated
    assert_error(admin.post(f"/v0/admin/plugins/{checked['registration_id']}/activate",
                            json={"idempotency_key": "rejected"}), 409, "registration_not_validated")


@pytest.mark.parametrize(("change", "field"), [
    ({"manifest": "{not json"}, "/manifest"),
    ({"manifest": json.dumps({"manifest_version": 1, "id": "pdf"})}, "/manifest"),
    ({"endpoint": "ftp://127.0.0.1:1"}, "/endpoint"),
    ({"settings": {"routes": [{"media_type": "image/png"}]}}, "/settings/routes/0/media_type"),
    ({"settings": {"configuration": {"unknown": 1}}}, "/settings/configuration"),
    ({"fixtures": [{"path": "/etc/passwd", "content_base64": ""}]}, "/fixtures/0/path"),
    ({"fixtures": [{"path": "a/../../b.json", "content_base64": ""}]}, "/fixtures/0/path"),
    ({"fixtures": [{"path": "a\\b.json", "content_base64": ""}]}, "/fixtures/0/path"),
    ({"fixtures": [{"path": "a.json", "content_base64": ""}, {"path": "a.json", "content_base64": ""}]},
     "/fixtures/1/path"),
    ({"fixtures": [{"path": "a.json", "content_base64": "!!!"}]}, "/fixtures"),
    ({"fixtures": [{"path": f"f{n}.json", "content_base64": ""} for n in range(101)]}, "/fixtures"),
    ({"artifact_digest": "md5:abc"}, "/artifact_digest"),
])
def test_invalid_registrations_are_refused_with_the_field(admin, pdf, change, field):
    # decisions-part2 "Registration request": 422 invalid_plugin with field, at once
    body = {**registration(pdf, PDF, f"invalid-{field}"), **change}
    error = assert_error(admin.post("/v0/admin/plugins", json=body), 422, "invalid_plugin")
    assert error["field"].startswith(field), error


def test_an_evaluator_cannot_be_activated(admin, tmp_path):
    # part 2 states: an alert-rule (subscription) plugin cannot be activated (422 unsupported_role)
    plugin = PluginProcess("fixture-evaluator", tmp_path)
    try:
        created = admin.post("/v0/admin/plugins", json=registration(plugin, EVALUATOR, "evaluator")).json()
        checked = wait_state(admin, created["registration_id"], ("validated", "rejected"))
        assert checked["state"] == "validated", checked["check"]
        assert checked["roles"] == ["subscription:fixture-evaluator"]
        assert_error(admin.post(f"/v0/admin/plugins/{created['registration_id']}/activate",
                                json={"idempotency_key": "evaluator"}), 422, "unsupported_role")
    finally:
        plugin.stop()


def test_permissions(deployment, admin):
    # decisions-part2 "Errors added": plugins:admin routes with an organization key are 403 forbidden
    url = deployment.database_url
    with httpx.Client(base_url=deployment.base_url, timeout=30,
                      headers={"Authorization": f"Bearer {operator_key(url, operator=False)}"}) as org_key:
        assert_error(org_key.get("/v0/admin/plugins"), 403, "forbidden")
        assert_error(org_key.get("/v0/admin/plugins/plan"), 403, "forbidden")
        assert_error(org_key.post("/v0/admin/plugins", json={"idempotency_key": "k", "manifest": "{}",
                                                             "endpoint": "http://x"}), 403, "forbidden")
        # part 2: active-plugins needs observability:read on a key granting every Corpus, names no
        # address, configuration, manifest or digest
        listed = org_key.get("/v0/admin/active-plugins")
        assert listed.status_code == 200, listed.text
        text = listed.text
        assert "endpoint" not in text and "127.0.0.1" not in text and "digest" not in text
        assert "manifest" not in text and "configuration" not in text
        plan = admin.get("/v0/admin/plugins/plan")
        if plan.status_code == 200:
            assert listed.json()["plan_activated_at"] == plan.json()["activated_at"]
            assert {i["plugin_id"] for i in listed.json()["items"]} == {r["plugin_id"] for r in plan.json()["roles"]}
    with httpx.Client(base_url=deployment.base_url, timeout=30, headers={
            "Authorization": f"Bearer {operator_key(url, 'observability:read', 'c1', operator=False)}"}) as scoped:
        assert_error(scoped.get("/v0/admin/active-plugins"), 403, "forbidden")
