"""Connectors end to end: `contentsvc run` with the first-party `rss` plugin pinned and launched,
the built-in `fixture` kind enabled and a credential key, pulling real feed files from a loopback
HTTP server the test controls (part 2 "Connector", "Connector management"; decisions-part2
"Connectors")."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from contentsvc.processes.local_service import free_port
from contentsvc.projectors.runner import runner_application_name

from tests.conftest import (ServerProcess, assert_error, client_for, create_corpus, key_for, until, wait_resolved,
                            worker_status_rows)
from tests.e2e.conftest import changes, feed_start
from tests.integration.feed_server import FEEDS, FeedServer

PLUGINS = Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins"
CREDENTIAL_KEY = base64.b64encode(os.urandom(32)).decode()
HOUR = 3600


@pytest.fixture(scope="module")
def feeds():
    server = FeedServer.on_fixture_port_or_any()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("connectors")
    for name in ("rss", "social_list"):
        (folder / name).mkdir()
        shutil.copy(PLUGINS / name / "contentsvc-plugin.json", folder / name)
    config = folder / "contentsvc.toml"
    config.write_text(
        f'[plugins.rss]\nendpoint = "http://127.0.0.1:{free_port()}"\nversion = "0.1.0"\n'
        f'manifest = "rss/contentsvc-plugin.json"\nlaunch = "rss"\n'
        f'configuration = {{ allow_private_networks = true, timeout_seconds = 5 }}\n\n'
        f'[plugins.social_list]\nendpoint = "http://127.0.0.1:{free_port()}"\nversion = "0.1.0"\n'
        f'manifest = "social_list/contentsvc-plugin.json"\nlaunch = "social_list"\n'
        f'configuration = {{ timeout_seconds = 2, allow_insecure_instance = true }}\n\n'
        f'[connectors]\nfixture_enabled = true\ninterval_floor_seconds = 1\n'
        f'credential_key = "{CREDENTIAL_KEY}"\npublic_base_url = "https://contentsvc.example"\n')
    url = databases.create()
    server = ServerProcess(url, folder, {"CONTENTSVC_CONFIG": str(config)})
    yield server, url
    server.stop()


def client(deployment, org: str, actions: str = "*") -> httpx.Client:
    server, url = deployment
    return client_for(server, key_for(url, org, actions))


def org() -> str:
    return f"org_{uuid.uuid4().hex[:10]}"


def create(c: httpx.Client, corpus_id: str, kind: str, config: dict, **extra) -> dict:
    body = {"idempotency_key": uuid.uuid4().hex, "corpus_id": corpus_id, "source_namespace": extra.pop("ns", "feed"),
            "kind": kind, "config": config, "schedule": {"interval_seconds": HOUR}, **extra}
    r = c.post("/v0/connectors", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def finished_runs(c: httpx.Client, connector_id: str, count: int) -> list[dict]:
    """The Connector's runs, newest first, once `count` of them have ended."""
    def ended():
        items = c.get(f"/v0/connectors/{connector_id}/runs").json()["items"]
        done = [r for r in items if r["state"] in ("succeeded", "failed", "skipped")]
        return items if len(done) >= count else None
    return until(ended, f"{count} finished runs of {connector_id}", timeout=30)


def request_run(c: httpx.Client, connector_id: str) -> dict:
    r = c.post(f"/v0/connectors/{connector_id}/runs", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 202, r.text
    return r.json()


def hits(c: httpx.Client, query: str, corpus_id: str) -> list[dict]:
    r = c.post("/v0/search", json={"query": query, "corpus_ids": [corpus_id], "mode": "lexical"})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def test_an_rss_feed_becomes_searchable_records_without_duplicates_across_runs(deployment, feeds):
    # decisions-part2 "Runs": the first scheduled run at creation; each item one ingest with key
    # con:{connector_id}:{record_key}:{revision}; the page's Receipts and checkpoint in one transaction;
    # rss: conditional GET, an unchanged revision is not sent again, an edited item is a new Version.
    owner = org()
    c = client(deployment, owner)
    corpus = create_corpus(c)
    cursor = feed_start(c, corpus)
    without = client(deployment, owner, actions="changes:read")  # no connectors:read
    cursor_without = feed_start(without, corpus)
    connector = create(c, corpus, "rss", {"url": f"{feeds.base_url}/feeds/harbour.rss"})
    connector_id = connector["connector_id"]
    assert connector["health"]["state"] == "active" and connector["schedule"] == {"interval_seconds": HOUR}
    assert "webhook_url" not in connector  # rss declares no push

    [first] = finished_runs(c, connector_id, 1)
    assert (first["state"], first["trigger"], first["pages"], first["receipts_created"]) == \
        ("succeeded", "schedule", 1, 3), first
    until(lambda: hits(c, "crane", corpus) or None, "the feed's items searchable")

    # Fetched again: a 304, nothing new.
    request_run(c, connector_id)
    second = finished_runs(c, connector_id, 2)[0]
    assert (second["state"], second["trigger"], second["receipts_created"]) == ("succeeded", "request", 0)

    # One item edited at the source: one new Version, of the same Record.
    edited = (FEEDS / "harbour.rss").read_bytes().replace(b"Work resumes Monday.", b"Work resumes Tuesday.")
    feeds.overrides["/feeds/harbour.rss"] = edited
    try:
        request_run(c, connector_id)
        third = finished_runs(c, connector_id, 3)[0]
    finally:
        del feeds.overrides["/feeds/harbour.rss"]
    assert (third["state"], third["receipts_created"]) == ("succeeded", 1), third
    until(lambda: hits(c, "tuesday", corpus) or None, "the edited item searchable")

    view = c.get(f"/v0/connectors/{connector_id}").json()
    health = view["health"]
    assert health["state"] == "active" and "last_success_at" in health and "last_item_at" in health
    assert health["usage"]["items_read"] == 4  # 3, then 0 (304), then the one edited
    assert health["diagnostics"]["feed_version"] == "rss20"
    # decisions-part2 "Change-feed event kinds added": connector.* in the Connector's Corpus.
    kinds = {e["kind"] for e in changes(c, corpus, cursor)[0]}
    assert {"connector.created", "connector.run.changed"} <= kinds
    # ... visible only with connectors:read besides changes:read.
    assert not any(e["kind"].startswith("connector.") for e in changes(without, corpus, cursor_without)[0])


def test_refusals_of_the_source_show_in_runs_and_health(deployment, feeds):
    # decisions-part2 rss: 401/403 class access -> health access_error; 404 class source -> last_error only
    c = client(deployment, org())
    corpus = create_corpus(c)
    refused = create(c, corpus, "rss", {"url": f"{feeds.base_url}/status/401"}, ns="refused")
    missing = create(c, corpus, "rss", {"url": f"{feeds.base_url}/status/404"}, ns="missing")
    [run] = finished_runs(c, refused["connector_id"], 1)
    assert run["state"] == "failed" and run["error"]["code"] == "http_401" and run["error"]["error_class"] == "access"
    assert c.get(f"/v0/connectors/{refused['connector_id']}").json()["health"]["state"] == "access_error"
    [run] = finished_runs(c, missing["connector_id"], 1)
    assert run["error"]["code"] == "http_404" and run["error"]["error_class"] == "source"
    health = c.get(f"/v0/connectors/{missing['connector_id']}").json()["health"]
    assert health["state"] == "active" and health["last_error"]["code"] == "http_404"


def test_an_item_holding_u0000_is_rejected_and_the_others_are_ingested(deployment, feeds):
    # decisions-part2 "Runs": an item that is not a valid item counts in items_rejected and the run
    # goes on. A JSON Feed may escape U+0000, which no stored text can hold (docs/decisions.md).
    owner = org()
    c = client(deployment, owner)
    corpus = create_corpus(c)
    feed = {"version": "https://jsonfeed.org/version/1.1", "title": "Harbour", "items": [
        {"id": "clean", "content_text": "Cranes are back at the harbour."},
        {"id": "nul-text", "content_text": "A text with a \u0000 in it."},
        {"id": "nul-\u0000-id", "content_text": "An id with one."}]}
    feeds.overrides["/feeds/nul.json"] = json.dumps(feed).encode()
    try:
        connector = create(c, corpus, "rss", {"url": f"{feeds.base_url}/feeds/nul.json"}, ns="nul")
        [run] = finished_runs(c, connector["connector_id"], 1)
    finally:
        del feeds.overrides["/feeds/nul.json"]
    # The rss plugin keys an id holding U+0000 by its sha256 (as one too long): that item is ingested.
    assert (run["state"], run["receipts_created"], run["items_rejected"]) == ("succeeded", 2, 1), run
    until(lambda: hits(c, "cranes", corpus) or None, "the clean item searchable")
    # Pushed, the same is 422 item_rejected (part 2 "Declared push route" rule 7), not a storage error.
    cid = fixture_push(c, corpus, "nul-push")["connector_id"]
    pusher = client(deployment, owner, actions="connector:push")
    for item in ({"record_key": "k", "revision": "1\u0000", "text": "a NUL in the revision"},
                 {"record_key": "k", "revision": "1", "text": "a NUL \u0000 in the text"}):
        assert_error(pusher.post(f"/v0/connectors/{cid}/api/ingest_key", json={"items": [item]}), 422, "item_rejected")


def test_the_fixture_kind_reads_its_items_in_pages_and_withdraws(deployment):
    # decisions-part2 "Built-in `fixture` kind": checkpoint {offset}, pages of page_size while more
    c = client(deployment, org())
    corpus = create_corpus(c)
    items = [{"record_key": f"k{n}", "revision": "1", "text": f"lighthouse keeper number {n}"} for n in range(5)]
    connector = create(c, corpus, "fixture", {"items": items, "page_size": 2})
    [run] = finished_runs(c, connector["connector_id"], 1)
    assert (run["state"], run["pages"], run["items_seen"], run["receipts_created"]) == ("succeeded", 3, 5, 5)
    until(lambda: len(hits(c, "lighthouse", corpus)) == 5 or None, "five fixture items searchable")


def test_a_list_filter_outside_its_values_is_refused_and_an_empty_one_is_left_out(deployment):
    # decisions.md Errors: a query fault is 422 invalid_input naming the parameter; the served
    # document's enums (listConnectors enabled, listConnectorRuns and listMatches state) are the
    # values a filter takes, never silently a filter that matches nothing or the opposite.
    c = client(deployment, org())
    connector = create(c, create_corpus(c), "fixture", {"items": []})
    runs = f"/v0/connectors/{connector['connector_id']}/runs"
    for path, params in (("/v0/connectors", {"enabled": "yes"}), (runs, {"state": "null"}),
                         ("/v0/matches", {"state": "gone"})):
        [name] = params
        error = assert_error(c.get(path, params=params), 422, "invalid_input")
        assert error["field"] == f"/{name}" and f"{name}: must be one of " in error["message"], error
    # an empty value is the parameter left out (the document says so with allowEmptyValue)
    listed = c.get("/v0/connectors", params={"enabled": "", "page_cursor": ""})
    assert listed.status_code == 200
    assert [x["connector_id"] for x in listed.json()["items"]] == [connector["connector_id"]]
    assert c.get(runs, params={"state": "succeeded"}).status_code == 200


def test_connectors_are_listed_page_by_page_under_a_kind_filter(deployment):
    # decisions-part2 "Create, read, list": ascending id, the cursor bound to the filters (part 1
    # rule 6: another filter is 409 cursor_scope_changed). A second page used to be a 500: the
    # cursor could not carry the `kind` filter.
    c = client(deployment, org())
    corpus = create_corpus(c)
    made = sorted(create(c, corpus, "fixture", {"items": []}, ns=f"feed-{n}")["connector_id"] for n in range(3))
    listed, cursor = [], None
    for _ in range(4):  # three pages of one, the last without a cursor
        params = {"kind": "fixture", "limit": 1, **({"page_cursor": cursor} if cursor else {})}
        page = c.get("/v0/connectors", params=params)
        assert page.status_code == 200, page.text
        listed += [x["connector_id"] for x in page.json()["items"]]
        cursor = page.json().get("next_page_cursor")
        if cursor is None:
            break
        moved = c.get("/v0/connectors", params={"kind": "rss", "limit": 1, "page_cursor": cursor})
        assert_error(moved, 409, "cursor_scope_changed")
    assert listed == made


def test_management_answers_and_refusals(deployment, feeds):
    # decisions-part2 "Create, read, list" refusals in order, "Commands on a Connector", "Credentials"
    c = client(deployment, org())
    corpus = create_corpus(c)
    url = f"{feeds.base_url}/feeds/harbour.atom"
    base = {"corpus_id": corpus, "source_namespace": "news", "kind": "rss", "config": {"url": url}}

    def post(**body):
        return c.post("/v0/connectors", json={"idempotency_key": uuid.uuid4().hex, **base, **body})

    assert_error(post(kind="mailbox"), 422, "unsupported_connector_kind")["field"] == "/kind"
    assert assert_error(post(config={}), 422, "invalid_config")["field"] == "/config"
    assert assert_error(post(config={"url": 5}), 422, "invalid_config")["field"] == "/config/url"
    assert assert_error(post(credential={"secret": {"token": 7}}), 422,
                        "invalid_config")["field"].startswith("/credential/secret")
    assert assert_error(post(schedule={"interval_seconds": 90000}), 422,
                        "invalid_interval")["field"] == "/schedule/interval_seconds"
    assert assert_error(post(push_policy={}), 422, "invalid_config")["field"] == "/push_policy"
    assert assert_error(post(corpus_id="absent-corpus"), 404, "not_found")

    key = uuid.uuid4().hex
    body = {"idempotency_key": key, **base, "schedule": {"interval_seconds": HOUR},
            "credential": {"secret": {"token": "s3cret-token-value"}, "expires_at": "2099-01-01T00:00:00Z"}}
    created = c.post("/v0/connectors", json=body)
    assert created.status_code == 201 and created.headers["location"].endswith(created.json()["connector_id"])
    connector = created.json()
    connector_id = connector["connector_id"]
    assert connector["credential"]["version"] == 1 and "secret" not in connector["credential"]
    assert "s3cret-token-value" not in created.text
    replay = c.post("/v0/connectors", json=body)
    assert replay.status_code == 200 and replay.json()["connector_id"] == connector_id
    assert_error(c.post("/v0/connectors", json={**body, "source_namespace": "other"}), 409, "idempotency_conflict")
    assert_error(post(), 409, "namespace_in_use")

    # Another Organization sees nothing of it.
    stranger = client(deployment, org())
    assert_error(stranger.get(f"/v0/connectors/{connector_id}"), 404, "not_found")
    assert stranger.get("/v0/connectors").json()["items"] == []

    # Credential rotation: version + 1, a replay answers the same.
    rotate = {"idempotency_key": uuid.uuid4().hex, "secret": {"token": "another-secret"}}
    r = c.put(f"/v0/connectors/{connector_id}/credential", json=rotate)
    assert r.status_code == 200 and r.json()["credential"]["version"] == 2 and "another-secret" not in r.text
    assert c.put(f"/v0/connectors/{connector_id}/credential", json=rotate).json()["credential"]["version"] == 2

    r = c.put(f"/v0/connectors/{connector_id}/schedule", json={"interval_seconds": 600})
    assert r.status_code == 200 and r.json()["schedule"] == {"interval_seconds": 600}
    assert assert_error(c.put(f"/v0/connectors/{connector_id}/schedule", json={"interval_seconds": 0}), 422,
                        "invalid_interval")["field"] == "/interval_seconds"

    listed = c.get("/v0/connectors", params={"kind": "rss", "limit": 1}).json()
    assert [i["connector_id"] for i in listed["items"]] == [connector_id]
    assert c.get("/v0/connectors", params={"enabled": "false"}).json()["items"] == []

    kinds = c.get("/v0/connector-kinds").json()
    assert kinds["credential_deposits"] is True
    assert [k["kind"] for k in kinds["items"]] == ["fixture", "rss", "social_list"]
    fixture = create(c, corpus, "fixture", {"items": []}, ns="fixture")
    assert fixture["webhook_url"] == f"https://contentsvc.example/v0/connector-webhooks/{fixture['connector_id']}"
    assert fixture["push_policy"] == {"rate_per_second": 10.0, "burst": 20}

    # Disable is final: health disabled, no next run, commands 409, a repeat 200.
    r = c.post(f"/v0/connectors/{connector_id}/disable", json={})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["health"]["state"] == "disabled"
    assert "disabled_at" in r.json() and "next_run_at" not in r.json()
    assert c.post(f"/v0/connectors/{connector_id}/disable", json={}).status_code == 200
    assert_error(c.post(f"/v0/connectors/{connector_id}/runs", json={"idempotency_key": "k"}), 409,
                 "connector_disabled")
    assert_error(c.put(f"/v0/connectors/{connector_id}/schedule", json={"interval_seconds": 60}), 409,
                 "connector_disabled")
    assert c.get("/v0/connectors", params={"enabled": "false"}).json()["items"][0]["connector_id"] == connector_id
    assert post().status_code == 201  # the namespace is free again

    # Reads need connectors:read, writes connectors:write.
    reader = client(deployment, org(), actions="corpora:read")
    assert_error(reader.get("/v0/connectors"), 403, "forbidden")


# ---------------------------------------------------------------- push routes and the relay


def fixture_push(c: httpx.Client, corpus: str, ns: str, **extra) -> dict:
    return create(c, corpus, "fixture", {"items": []}, ns=ns, credential={"secret": {"token": "fixture-token"}},
                  **extra)


def items(*keys: str) -> dict:
    return {"items": [{"record_key": k, "revision": "1", "text": f"pushed notice {k}"} for k in keys]}


def signed_headers(body: bytes, token: str = "fixture-token", at: int | None = None) -> dict:
    import hashlib
    import hmac
    import time
    return {"x-fixture-signature": hmac.new(token.encode(), body, hashlib.sha256).hexdigest(),
            "x-fixture-timestamp": str(int(time.time()) if at is None else at), "content-type": "application/json"}


def test_a_connector_holds_at_most_20_unrevoked_instance_tokens(deployment):
    # decisions-part2 "Instance tokens": the 21st unrevoked token is 409 instance_token_limit.
    c = client(deployment, org())
    cid = fixture_push(c, create_corpus(c), "tokens")["connector_id"]
    made = [c.post(f"/v0/connectors/{cid}/instance-tokens", json={"idempotency_key": f"t{i}", "name": f"box {i}"})
            for i in range(20)]
    assert [r.status_code for r in made] == [201] * 20
    assert_error(c.post(f"/v0/connectors/{cid}/instance-tokens", json={"idempotency_key": "t20", "name": "one more"}),
                 409, "instance_token_limit")
    assert c.post(f"/v0/connectors/{cid}/instance-tokens/{made[0].json()['token_id']}/revoke", json={}).status_code == 200
    assert c.post(f"/v0/connectors/{cid}/instance-tokens",
                  json={"idempotency_key": "t21", "name": "after a revocation"}).status_code == 201


def test_push_routes_guard_and_converge_on_receipts(deployment):
    # part 2 "Declared push route" rules 2-12; decisions-part2 "Built-in `fixture` kind", "Instance tokens"
    owner = org()
    c = client(deployment, owner)
    corpus = create_corpus(c)
    connector = fixture_push(c, corpus, "pushed")
    cid = connector["connector_id"]
    server, url = deployment
    anon = httpx.Client(base_url=server.base_url, timeout=30)
    api = f"/v0/connectors/{cid}/api"

    # instance_token route: a token of this Connector, shown once; an API key is not one.
    created = c.post(f"/v0/connectors/{cid}/instance-tokens", json={"idempotency_key": "t1", "name": "relay box"})
    assert created.status_code == 201 and created.json()["secret"].startswith("cit_")
    secret = created.json()["secret"]
    replay = c.post(f"/v0/connectors/{cid}/instance-tokens", json={"idempotency_key": "t1", "name": "relay box"})
    assert replay.status_code == 200 and "secret" not in replay.json()
    assert secret not in c.get(f"/v0/connectors/{cid}/instance-tokens").text
    token = {"authorization": f"Bearer {secret}"}
    assert_error(anon.post(f"{api}/ingest", json=items("a"), headers={"authorization": c.headers["authorization"]}),
                 401, "invalid_instance_token")
    first = anon.post(f"{api}/ingest", json=items("a", "b"), headers={**token, "idempotency-key": "p1"})
    assert first.status_code == 202, first.text
    receipts = first.json()["receipts"]
    assert [r["source"]["record_key"] for r in receipts] == ["a", "b"]
    again = anon.post(f"{api}/ingest", json=items("a", "b"), headers={**token, "idempotency-key": "p1"})
    assert again.status_code == 202 and again.content == first.content  # rule 10: replayed, no plugin call
    # Pull and push converge: the same revision pushed again without a key replays the same Receipts.
    assert anon.post(f"{api}/ingest", json=items("a"), headers=token).json()["receipts"][0]["receipt_id"] == \
        receipts[0]["receipt_id"]

    # service_key route: connector:push on the instance's Corpus.
    pusher = client(deployment, owner, actions="connector:push")
    assert pusher.post(f"{api}/ingest_key", json=items("c")).status_code == 202
    assert_error(client(deployment, owner, actions="content:write").post(f"{api}/ingest_key", json=items("c")),
                 403, "forbidden")
    assert_error(anon.post(f"{api}/ingest_key", json=items("c")), 401, "invalid_api_key")
    assert_error(client(deployment, org(), actions="connector:push").post(f"{api}/ingest_key", json=items("c")),
                 404, "not_found")

    # Request guards: undeclared route and method, size, JSON, request_schema.
    assert_error(pusher.post(f"{api}/nowhere", json=items("d")), 404, "not_found")
    wrong_method = pusher.put(f"{api}/ingest", json=items("d"))
    assert_error(wrong_method, 405, "method_not_allowed")
    assert wrong_method.headers["allow"] == "POST"
    assert_error(pusher.post(f"{api}/ingest_key", content=b"x" * (1024 * 1024 + 1)), 413, "request_too_large")
    assert_error(pusher.post(f"{api}/ingest_key", content=b"{not json"), 400, "malformed_json")
    assert_error(pusher.post(f"{api}/ingest_key", json={"things": []}), 422, "invalid_schema")

    # signature route: the plugin verifies; the engine checks the timestamp window and reserves the signature.
    body = msgspec_bytes(items("s1"))
    signed = anon.post(f"{api}/signed", content=body, headers=signed_headers(body))
    assert signed.status_code == 202, signed.text
    assert_error(anon.post(f"{api}/signed", content=body, headers=signed_headers(body)), 409, "push_replayed")
    stale = msgspec_bytes(items("s2"))
    assert_error(anon.post(f"{api}/signed", content=stale, headers=signed_headers(stale, at=1)), 401,
                 "invalid_signature")
    forged = anon.post(f"{api}/signed", content=stale, headers=signed_headers(stale, token="wrong"))
    assert forged.status_code == 401 and forged.headers["service-response-origin"] == "plugin"

    # The relay: no key; the kind's plugin (here the core) decides.
    relayed = anon.post(f"/v0/connector-webhooks/{cid}", json=items("r1"))
    assert relayed.status_code == 200, relayed.text

    view = c.get(f"/v0/connectors/{cid}").json()
    counters = view["push_counters"]
    assert counters["received"] >= 6 and counters["refused"] >= 8 and counters["replayed"] == 1
    assert view["health"]["push"]["state"] == "active"
    until(lambda: len(hits(c, "pushed", corpus)) >= 4 or None, "pushed items searchable")

    # A revoked token, then a disabled Connector: 401, then 404 everywhere.
    token_id = created.json()["token_id"]
    assert c.post(f"/v0/connectors/{cid}/instance-tokens/{token_id}/revoke", json={}).json()["revoked_at"]
    assert_error(anon.post(f"{api}/ingest", json=items("z"), headers=token), 401, "invalid_instance_token")
    c.post(f"/v0/connectors/{cid}/disable", json={})
    assert_error(pusher.post(f"{api}/ingest_key", json=items("z")), 404, "not_found")
    assert_error(anon.post(f"/v0/connector-webhooks/{cid}", json=items("z")), 404, "not_found")


def test_declared_routes_answer_each_declared_method(deployment):
    # decisions-part2 "Push route": methods are a subset of POST, PUT, PATCH, DELETE, GET only for a
    # challenge; part 2 "Declared push route" rules 3 and 12. The fixture kind's `ingest_key` declares
    # the four writing methods (DELETE withdraws its items), `signed` POST and a GET challenge.
    owner = org()
    c = client(deployment, owner)
    corpus = create_corpus(c)
    cid = fixture_push(c, corpus, "methods")["connector_id"]
    pusher = client(deployment, owner, actions="connector:push")
    api = f"/v0/connectors/{cid}/api"

    put = pusher.put(f"{api}/ingest_key", json=items("m1"))
    patch = pusher.patch(f"{api}/ingest_key", json=items("m2"))
    assert (put.status_code, patch.status_code) == (202, 202), (put.text, patch.text)
    for answer, key in ((put, "m1"), (patch, "m2")):
        assert [r["source"]["record_key"] for r in answer.json()["receipts"]] == [key]
    until(lambda: len(hits(c, "pushed notice", corpus)) == 2 or None, "PUT and PATCH items searchable")
    deleted = pusher.request("DELETE", f"{api}/ingest_key", json=items("m1"))
    assert deleted.status_code == 202, deleted.text
    kept = wait_resolved(c, patch.json()["receipts"][0]["receipt_id"])["record_id"]
    until(lambda: [h["record_id"] for h in hits(c, "pushed notice", corpus)] == [kept] or None,
          "the DELETEd item withdrawn")

    # A GET challenge skips the signature guards and gets the plugin's own answer back.
    challenge = httpx.get(f"{deployment[0].base_url}{api}/signed", params={"challenge": "c-41"}, timeout=30)
    assert challenge.status_code == 200 and challenge.text == "c-41"
    assert "service-response-origin" not in challenge.headers
    # GET where no challenge is declared is 405 naming what is; an unknown instance is 404 first.
    refused = pusher.get(f"{api}/ingest_key")
    assert_error(refused, 405, "method_not_allowed")
    assert refused.headers["allow"] == "DELETE, PATCH, POST, PUT"
    assert_error(pusher.patch("/v0/connectors/con_missing/api/ingest", json=items("x")), 404, "not_found")
    # rule 11: every attempt is audited, whatever its method.
    counters = c.get(f"/v0/connectors/{cid}").json()["push_counters"]
    assert (counters["received"], counters["refused"]) == (4, 1)


def test_each_push_is_audited_once_with_its_items_or_alone(deployment):
    # part 2 "Declared push route" rule 11: every attempt's audit event and counters are committed
    # before its answer leaves; rule 7: a refused item is 422 item_rejected. Pushes whose items are
    # all newly accepted are audited in their items' transaction; the first push (push health not
    # yet active), a replayed item and a refusal are audited on their own: each exactly once.
    owner = org()
    c = client(deployment, owner)
    cid = fixture_push(c, create_corpus(c), "audited", push_policy={"rate_per_second": 100, "burst": 100})["connector_id"]
    pusher = client(deployment, owner, actions="connector:push")
    api = f"/v0/connectors/{cid}/api/ingest_key"

    def counters() -> tuple[int, int]:
        seen = c.get(f"/v0/connectors/{cid}").json()["push_counters"]
        return seen["received"], seen["refused"]

    assert pusher.post(api, json=items("first")).status_code == 202
    assert counters() == (1, 0)
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda n: pusher.post(api, json=items(f"c{n}", f"d{n}")), range(24)))
    assert [a.status_code for a in answers] == [202] * 24, [a.text for a in answers if a.status_code != 202]
    assert counters() == (25, 0)  # read at once: each answer left after its audit committed

    again = pusher.post(api, json=items("c0", "new"))
    assert again.status_code == 202
    assert again.json()["receipts"][0]["receipt_id"] == answers[0].json()["receipts"][0]["receipt_id"]
    refused = pusher.post(api, json={"items": [{"record_key": "fine", "revision": "1", "text": "fine"},
                                               {"record_key": 7, "revision": "1", "text": "a number for a key"}]})
    assert_error(refused, 422, "item_rejected")
    assert counters() == (26, 1)
    with psycopg.connect(deployment[0].database_url) as conn:
        kinds = conn.execute("SELECT kind, count(*) FROM journal WHERE subject_id = %s AND kind LIKE"
                             " 'connector.push.%%' GROUP BY kind ORDER BY kind", (cid,)).fetchall()
        # The 24 concurrent pushes were audited in the transactions that accepted their items.
        with_items = conn.execute(
            "SELECT count(*) FROM journal p WHERE p.subject_id = %s AND p.kind = 'connector.push.received'"
            " AND EXISTS (SELECT 1 FROM journal i WHERE i.xmin = p.xmin AND i.kind NOT LIKE 'connector.%%')",
            (cid,)).fetchone()[0]
    assert kinds == [("connector.push.received", 26), ("connector.push.refused", 1)]
    assert with_items == 24


def test_a_pushed_entry_missing_a_member_is_item_rejected(deployment):
    # part 2 "Declared push route" rule 7: a refused item is 422 item_rejected, never a server error.
    # The fixture kind reads record_key, revision and (unless withdrawn) text of each entry.
    owner = org()
    c = client(deployment, owner)
    cid = fixture_push(c, create_corpus(c), "partial")["connector_id"]
    pusher = client(deployment, owner, actions="connector:push")
    api = f"/v0/connectors/{cid}/api/ingest_key"
    assert_error(pusher.post(api, json={"items": [{"record_key": "no-text", "revision": "1"}]}), 422, "item_rejected")
    assert_error(pusher.request("DELETE", api, json={"items": [{"revision": "1"}]}), 422, "item_rejected")
    withdrawn = pusher.post(api, json={"items": [{"record_key": "gone", "revision": "1", "withdraw": True}]})
    assert withdrawn.status_code == 202, withdrawn.text  # a withdrawal needs no text


def test_a_push_mixing_withdrawals_and_ingests_is_accepted_in_item_order(deployment):
    # part 2 "Declared push route": receipts in item order, including withdrawals; part 1 rule 17:
    # activation follows acceptance order. A withdrawal is a terminal fence (part 1 "Record"), so
    # the item re-sending a Record after its withdrawal is a conflict, and one sent before it is
    # created and then withdrawn: each as its place in the push says.
    owner = org()
    c = client(deployment, owner)
    cid = fixture_push(c, create_corpus(c), "mixed")["connector_id"]
    pusher = client(deployment, owner, actions="connector:push")
    r = pusher.post(f"/v0/connectors/{cid}/api/ingest_key", json={"items": [
        {"record_key": "fenced", "revision": "1", "withdraw": True},
        {"record_key": "fenced", "revision": "2", "text": "sent again after its withdrawal"},
        {"record_key": "kept", "revision": "1", "text": "sent before its withdrawal"},
        {"record_key": "kept", "revision": "2", "withdraw": True}]})
    assert r.status_code == 202, r.text
    outcomes = [wait_resolved(c, receipt["receipt_id"])["outcome"] for receipt in r.json()["receipts"]]
    assert outcomes == ["withdrawal_applied", "conflict", "created", "withdrawal_applied"]


def msgspec_bytes(value) -> bytes:
    import json
    return json.dumps(value).encode()


def test_rate_and_address_guards_refuse_before_the_plugin(deployment):
    # rule 9: token bucket 429 with Retry-After; allowed_cidrs 403 ip_not_allowed
    owner = org()
    c = client(deployment, owner)
    corpus = create_corpus(c)
    slow = fixture_push(c, corpus, "slow", push_policy={"rate_per_second": 0.1, "burst": 1})
    pusher = client(deployment, owner, actions="connector:push")
    api = f"/v0/connectors/{slow['connector_id']}/api/ingest_key"
    assert pusher.post(api, json=items("x")).status_code == 202
    limited = pusher.post(api, json=items("y"))
    assert_error(limited, 429, "rate_limited")
    assert int(limited.headers["retry-after"]) >= 1
    fenced = fixture_push(c, corpus, "fenced", push_policy={"allowed_cidrs": ["10.0.0.0/8"]})
    assert_error(pusher.post(f"/v0/connectors/{fenced['connector_id']}/api/ingest_key", json=items("x")), 403,
                 "ip_not_allowed")
    # A forged X-Forwarded-For from a peer that is not a trusted proxy is ignored.
    forged = pusher.post(f"/v0/connectors/{fenced['connector_id']}/api/ingest_key", json=items("x"),
                         headers={"x-forwarded-for": "10.1.2.3"})
    assert_error(forged, 403, "ip_not_allowed")
    counters = c.get(f"/v0/connectors/{slow['connector_id']}").json()["push_counters"]
    assert counters["rate_limited"] == 1 and counters["refused"] == 1


def test_a_change_made_by_any_path_reaches_the_next_pushes(deployment):
    # rule 9 (allowed_cidrs) under the API's cache of pushed-to Connectors (schema/026): a change
    # made outside the API, here plain SQL, is announced by the trigger and ends the cached copy.
    owner = org()
    c = client(deployment, owner)
    connector = fixture_push(c, create_corpus(c), "cached")
    pusher = client(deployment, owner, actions="connector:push")
    api = f"/v0/connectors/{connector['connector_id']}/api/ingest_key"
    assert pusher.post(api, json=items("x")).status_code == 202  # now cached
    _, url = deployment
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE connectors SET push_policy = push_policy || '{\"allowed_cidrs\": [\"10.0.0.0/8\"]}'"
                     " WHERE connector_id = %s", (connector["connector_id"],))
    until(lambda: pusher.post(api, json=items("y")).status_code == 403 or None, "the fence seen by pushes")
    assert_error(pusher.post(api, json=items("z")), 403, "ip_not_allowed")


def test_social_list_signed_receive_and_its_relay_share_one_guard(deployment):
    # decisions-part2 social_list: receive at api/receive, signature sha256=<hex HMAC-SHA256(signing_secret,
    # body)>, 300 s signature cache; rule 13: the relay address shares the guard and the receipts
    import hashlib
    import hmac
    import json
    from tests.integration.mastodon_double import status

    c = client(deployment, org())
    corpus = create_corpus(c)
    connector = create(c, corpus, "social_list", {"instance_url": "https://127.0.0.1:9", "list_id": "harbour"},
                       credential={"secret": {"token": "list-token", "signing_secret": "hub-secret"}})
    cid = connector["connector_id"]
    assert connector["health"]["push"]["state"] == "pending"
    server, _ = deployment
    anon = httpx.Client(base_url=server.base_url, timeout=30)

    def signed(payload: dict) -> tuple[bytes, dict]:
        body = json.dumps(payload).encode()
        digest = hmac.new(b"hub-secret", body, hashlib.sha256).hexdigest()
        return body, {"x-hub-signature-256": f"sha256={digest}", "content-type": "application/json"}

    body, headers = signed({"event": "update", "payload": status(7)})
    r = anon.post(f"/v0/connectors/{cid}/api/receive", content=body, headers=headers)
    assert r.status_code == 202, r.text
    assert r.json()["receipts"][0]["source"]["record_key"] == status(7)["uri"]
    assert_error(anon.post(f"/v0/connector-webhooks/{cid}", content=body, headers=headers), 409, "push_replayed")
    body, headers = signed({"event": "delete", "payload": status(7)["uri"]})
    assert anon.post(f"/v0/connector-webhooks/{cid}", content=body, headers=headers).status_code == 200
    wrong = anon.post(f"/v0/connectors/{cid}/api/receive", content=body,
                      headers={**headers, "x-hub-signature-256": "sha256=" + "0" * 64})
    assert wrong.status_code == 401 and wrong.headers["service-response-origin"] == "plugin"
    assert c.get(f"/v0/connectors/{cid}").json()["health"]["push"]["state"] == "active"


def test_a_replaced_credential_is_checked_with_the_plugin(deployment, feeds):
    # decisions-part2 "Runs": check_credential after creation with a credential and after each
    # replacement; a refusal of class access shows as health access_error before any run
    c = client(deployment, org())
    corpus = create_corpus(c)
    feeds.expected_authorization = "Bearer right-token"
    connector = create(c, corpus, "rss", {"url": f"{feeds.base_url}/auth/feeds/harbour.rss"}, ns="private",
                       credential={"secret": {"token": "right-token"}})
    cid = connector["connector_id"]
    [run] = finished_runs(c, cid, 1)
    assert run["state"] == "succeeded" and run["receipts_created"] == 3, run
    r = c.put(f"/v0/connectors/{cid}/credential",
              json={"idempotency_key": uuid.uuid4().hex, "secret": {"token": "revoked-token"}})
    assert r.status_code == 200
    health = until(lambda: (h := c.get(f"/v0/connectors/{cid}").json()["health"])["state"] == "access_error" and h,
                   "the replaced credential refused by the feed")
    assert health["last_error"]["code"] == "http_401"
    assert len(c.get(f"/v0/connectors/{cid}/runs").json()["items"]) == 1  # no run made it so


def test_a_social_list_is_pulled_page_by_page_from_its_instance(deployment):
    # decisions-part2 social_list: GET .../timelines/list/{list_id}?min_id=<checkpoint>&limit=40, more while a
    # page is full; record_key = the status uri; a later run reads only what is newer
    from tests.integration.mastodon_double import LIST_ID, TOKEN, MastodonDouble, status

    double = MastodonDouble.on_fixture_port_or_any()
    try:
        c = client(deployment, org())
        corpus = create_corpus(c)
        connector = create(c, corpus, "social_list", {"instance_url": double.base_url, "list_id": LIST_ID},
                           ns="social", credential={"secret": {"token": TOKEN}})
        cid = connector["connector_id"]
        [first] = finished_runs(c, cid, 1)
        assert (first["state"], first["pages"], first["receipts_created"]) == ("succeeded", 2, 40), first
        double.lists[LIST_ID].append(status(46, content="<p>Tug <b>Ellen</b> at berth nine</p>"))
        request_run(c, cid)
        second = finished_runs(c, cid, 2)[0]
        assert (second["state"], second["receipts_created"]) == ("succeeded", 1), second
        until(lambda: hits(c, "ellen", corpus) or None, "the newest status searchable")
        assert all(r[1].get("authorization") == f"Bearer {TOKEN}" for r in double.requests)
    finally:
        double.stop()


def test_a_slow_source_does_not_hold_up_other_connectors(deployment, feeds):
    # decisions-part2 [connectors] run_concurrency: runs of different Connectors proceed at once
    c = client(deployment, org())
    corpus = create_corpus(c)
    slow = create(c, corpus, "rss", {"url": f"{feeds.base_url}/slow/feeds/harbour.rss"}, ns="slow")
    def slow_state():
        runs = c.get(f"/v0/connectors/{slow['connector_id']}/runs").json()["items"]
        return runs[0]["state"] if runs else None

    until(lambda: slow_state() == "running" or None, "the slow run started")
    fast = create(c, corpus, "fixture", {"items": [{"record_key": "q", "revision": "1", "text": "quick"}]}, ns="fast")
    [run] = finished_runs(c, fast["connector_id"], 1)
    assert run["state"] == "succeeded"
    assert slow_state() == "running"


SECRETS = ("s3cret-token-value", "another-secret", "right-token", "revoked-token", "hub-secret", "list-token",
           "fixture-token", "fixture-social-token-1", CREDENTIAL_KEY)


def test_zz_no_credential_or_token_reaches_the_log(deployment):
    # decisions-part2 "Logging": never logged: instance tokens, credential secrets and fixture credentials,
    # authorization headers, push bodies. Runs last in this module: every test above deposited or sent these.
    server, _ = deployment
    log = server.log_path.read_text(errors="replace")
    assert "connector_run" in log and "connector_push" in log  # the runs and pushes above are in it
    assert [s for s in SECRETS if s in log] == []
    assert "cit_" not in log


def suspend_between_transactions(worker, url: str) -> None:
    """SIGSTOP the connectors worker at a moment its connection is idle, so that the rows it
    locks in its short transactions stay free for the API meanwhile (bounded: 50 tries)."""
    for _ in range(50):
        worker.suspend()
        with psycopg.connect(url) as conn:
            states = [row[0] for row in conn.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s",
                                                     (runner_application_name("connectors"),))]
        if states and set(states) == {"idle"}:
            return
        worker.resume()
        time.sleep(0.05)
    raise AssertionError(f"the connectors worker was never idle: {states}")


def test_worker_status_shows_a_requested_run_waiting_for_a_stopped_worker(deployment):
    # What an operator sees (`contentsvc worker status`): a run requested while the connectors
    # worker cannot take it waits in the queue, and leaves it once the worker goes on.
    server, url = deployment
    c = client(deployment, org())
    corpus = create_corpus(c)
    connector = create(c, corpus, "fixture", {"items": []}, ns="stopped-worker")
    finished_runs(c, connector["connector_id"], 1)  # the run at creation
    worker = server.children()["worker:connectors"]
    suspend_between_transactions(worker, url)  # alive, its lock held: the supervisor leaves it be
    try:
        request_run(c, connector["connector_id"])
        rows = worker_status_rows(url)
        assert rows["connectors"]["running"] == "yes", rows
        assert rows["connectors"]["waiting"].startswith("1 run queued"), rows
    finally:
        worker.resume()
    finished_runs(c, connector["connector_id"], 2)
    waiting = worker_status_rows(url)["connectors"]["waiting"]
    assert waiting.startswith("0 runs queued, "), waiting  # another test's slow run may still be running
