"""The first-party `social_list` connector as a real process against a real HTTP test double of
the Mastodon list-timeline API on loopback (decisions-part2, "Plugin processes and first-party
plugins": `social_list`)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import shutil

import httpx
import pytest

from tests.integration.first_party_checks import failures, plugin_check
from tests.integration.mastodon_double import (
    FIXTURE_PORT,
    LIST_ID,
    TOKEN,
    MastodonDouble,
    status,
)
from tests.integration.plugin_processes import PLUGINS, PluginProcess

INSECURE = {"allow_insecure_instance": True}
SECRET = "push-signing-secret-77"
NOW = "2026-03-05T12:00:00Z"


@pytest.fixture(scope="module")
def instance():
    double = MastodonDouble.on_fixture_port_or_any()
    yield double
    double.stop()


@pytest.fixture(scope="module")
def social_plugin(tmp_path_factory):
    plugin = PluginProcess("social_list", tmp_path_factory.mktemp("social"))
    yield plugin
    plugin.stop()


def call(plugin: PluginProcess, contribution: str, instance_url: str, *, checkpoint: object = None,
         configuration: dict | None = None, credential: dict | None = None, list_id: str = LIST_ID,
         **members) -> httpx.Response:
    return httpx.post(f"{plugin.base_url}/v0/contributions/connector/{contribution}", timeout=30, json={
        "invocation_id": "inv", "contribution": "connector", "organization_id": "org",
        "configuration": INSECURE if configuration is None else configuration,
        "connector": {"instance_id": "con1", "kind": "social_list", "corpus_id": "c1", "source_namespace": "social",
                      "config": {"instance_url": instance_url, "list_id": list_id}},
        "credential": {"token": TOKEN, "signing_secret": SECRET} if credential is None else credential,
        "now": NOW, "checkpoint": checkpoint, "page_in_run": 0, "reads_today": 0, **members})


def push(plugin: PluginProcess, instance_url: str, body: dict | str, *, signature: str | None = None,
         credential: dict | None = None, method: str = "POST", route: str = "receive") -> httpx.Response:
    raw = (body if isinstance(body, str) else json.dumps(body)).encode()
    headers = {"content-type": "application/json"}
    if signature != "":
        headers["x-hub-signature-256"] = signature or "sha256=" + hmac.new(SECRET.encode(), raw,
                                                                           hashlib.sha256).hexdigest()
    return call(plugin, "receive", instance_url, credential=credential, route=route, request={
        "method": method, "path": "receive", "query": "", "headers": headers,
        "body_base64": base64.b64encode(raw).decode()})


def test_pull_pages_with_min_id_while_pages_are_full(social_plugin, instance):
    # decisions-part2 social_list pull: GET .../timelines/list/{list_id}?min_id=&limit=40, Bearer token,
    # checkpoint {min_id}, more while a page is full
    first = call(social_plugin, "fetch", instance.base_url, checkpoint={"min_id": "100002"}).json()
    path, headers = instance.requests[-1]
    assert path.startswith(f"/api/v1/timelines/list/{LIST_ID}?") and "limit=40" in path and "min_id=100002" in path
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert len(first["items"]) == 40 and first["more"] is True
    assert first["checkpoint"] == {"min_id": "100042"}
    second = call(social_plugin, "fetch", instance.base_url, checkpoint=first["checkpoint"]).json()
    assert [item["record_key"].rsplit("/", 1)[1] for item in second["items"]] == ["100045", "100044", "100043"]
    assert second["more"] is False and second["checkpoint"] == {"min_id": "100045"}
    third = call(social_plugin, "fetch", instance.base_url, checkpoint=second["checkpoint"]).json()
    assert third["items"] == [] and third["more"] is False and third["checkpoint"] == {"min_id": "100045"}


def test_items_from_statuses(social_plugin, instance):
    # decisions-part2 social_list item: record_key the status uri, revision edited_at or created_at,
    # Part body = spoiler_text first, then the HTML content reduced to text
    instance.lists["edited"] = [status(1), status(2, edited=True, spoiler="Works notice",
                                                   content="<p>Berth <i>3</i> closed</p><p>until Friday</p>"),
                                status(3, content="")]
    page = call(social_plugin, "fetch", instance.base_url, list_id="edited").json()
    items = {item["record_key"]: item for item in page["items"]}
    assert set(items) == {status(1)["uri"], status(2)["uri"]}  # a status without text gives no item
    plain, edited = items[status(1)["uri"]], items[status(2)["uri"]]
    assert plain["revision"] == status(1)["created_at"] and plain["source_position"] == status(1)["created_at"]
    assert edited["revision"] == "2026-03-02T08:00:00.000Z"
    assert edited["content"]["parts"] == [{"key": "body", "role": "body", "content": {
        "kind": "text", "text": "Works notice\n\nBerth 3 closed\nuntil Friday"}}]


def test_pull_failures_carry_their_class(social_plugin, instance):
    # decisions-part2 connector errors: 401 access, 404 source, 5xx transient with Retry-After
    refused = call(social_plugin, "fetch", instance.base_url, credential={"token": "wrong"}).json()
    assert (refused["code"], refused["error_class"], refused["retryable"]) == ("http_401", "access", False)
    gone = call(social_plugin, "fetch", instance.base_url, list_id="deleted-list").json()
    assert (gone["code"], gone["error_class"]) == ("http_404", "source")
    instance.fail_with = 503
    try:
        busy = call(social_plugin, "fetch", instance.base_url).json()
    finally:
        instance.fail_with = None
    assert (busy["code"], busy["error_class"], busy["retryable"], busy["retry_after_seconds"]) == \
        ("http_503", "transient", True, 9)


def test_plain_http_instance_needs_the_operator_setting(social_plugin, instance):
    # decisions-part2 social_list: instance_url is https; plain http only with allow_insecure_instance
    count = len(instance.requests)
    answer = call(social_plugin, "fetch", instance.base_url, configuration={})
    assert answer.status_code == 502
    assert (answer.json()["code"], answer.json()["error_class"]) == ("insecure_instance_url", "source")
    refused = call(social_plugin, "check_credential", instance.base_url, configuration={})
    assert refused.json()["code"] == "insecure_instance_url"
    assert len(instance.requests) == count  # the token never went over plain http


def test_check_credential(social_plugin, instance):
    # decisions-part2: check_credential answers {status: ok} for a token the instance accepts
    assert call(social_plugin, "check_credential", instance.base_url).json() == {"status": "ok"}
    refused = call(social_plugin, "check_credential", instance.base_url, credential={"token": "nope"})
    assert refused.json()["error_class"] == "access"


def test_signed_update_gives_one_item_and_delete_a_withdrawal(social_plugin, instance):
    # decisions-part2 social_list push: signature sha256=<hex HMAC-SHA256(signing_secret, raw body)>;
    # update gives one item, delete (payload: status uri) gives a withdraw item
    update = push(social_plugin, instance.base_url, {"event": "update", "payload": status(50)})
    assert update.status_code == 200
    answer = update.json()
    assert answer["response"]["status"] == 200
    assert [item["record_key"] for item in answer["items"]] == [status(50)["uri"]]
    assert not answer["items"][0].get("withdraw")
    delete = push(social_plugin, instance.base_url, {"event": "delete", "payload": status(50)["uri"]},
                  route="relay").json()
    assert len(delete["items"]) == 1
    assert delete["items"][0]["record_key"] == status(50)["uri"] and delete["items"][0]["withdraw"] is True


def test_unsigned_or_wrongly_signed_pushes_are_refused(social_plugin, instance):
    # decisions-part2 social_list push: a wrong or missing signature is refused 401
    body = {"event": "update", "payload": status(51)}
    wrong = push(social_plugin, instance.base_url, body, signature="sha256=" + "0" * 64)
    assert wrong.status_code == 401 and wrong.json()["code"] == "invalid_signature"
    missing = push(social_plugin, instance.base_url, body, signature="")
    assert missing.status_code == 401
    # the signature covers the raw bytes: the same JSON re-serialized does not verify
    raw = json.dumps(body)
    signed = "sha256=" + hmac.new(SECRET.encode(), raw.encode(), hashlib.sha256).hexdigest()
    assert push(social_plugin, instance.base_url, json.dumps(body, indent=1), signature=signed).status_code == 401
    assert push(social_plugin, instance.base_url, body, method="GET").status_code == 405


def test_without_a_signing_secret_every_push_is_refused(social_plugin, instance):
    # decisions-part2 social_list: without signing_secret every push is refused 401 by the plugin
    answer = push(social_plugin, instance.base_url, {"event": "update", "payload": status(52)},
                  credential={"token": TOKEN})
    assert answer.status_code == 401 and answer.json()["code"] == "signing_secret_missing"
    assert SECRET not in answer.text and TOKEN not in answer.text


def test_contract_check_certifies_the_shipped_fixtures(social_plugin, instance, tmp_path):
    # decisions-part2 "Contract check": pages (a full page asks for more), check_credential, receive
    # cases (signed update, signed delete, bad signature), secrets not echoed
    folder = PLUGINS / "social_list"
    if instance.port != FIXTURE_PORT:  # the fixture port is taken: the same fixture, pointed at this double
        folder = tmp_path / "social_list"
        shutil.copytree(PLUGINS / "social_list", folder)
        fixture = folder / "fixtures" / "list_timeline.json"
        fixture.write_text(fixture.read_text().replace(f"127.0.0.1:{FIXTURE_PORT}", f"127.0.0.1:{instance.port}"))
    settings = tmp_path / "settings.toml"
    settings.write_text("[configuration]\nallow_insecure_instance = true\n")
    instance.lists[LIST_ID] = [status(n) for n in range(1, 46)]
    code, report = plugin_check(folder, social_plugin.base_url, "--settings", str(settings))
    assert code == 0, failures(report)
    assert report["certified"] is True and report["skipped"] == 0
    assert {check["id"] for check in report["checks"]} >= {"connector.fetch", "connector.check_credential",
                                                           "connector.receive", "secrets.not_echoed"}
