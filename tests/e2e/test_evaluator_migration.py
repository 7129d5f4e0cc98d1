"""Evaluator migration over a real server (part 2 "Evaluator migration (plugins:admin)";
decisions-part2 "Activation, plans, rollback": subscription roles are the startup configuration's,
so a new evaluator version is served by restarting with a configuration pinning it).

The deployment first pins the first-party fixture evaluator 0.1.0 (launched by `contentsvc run`);
Subscriptions are made on it; then it restarts, on the same database and home, pinning 0.2.0: a
second build of the fixture evaluator (tests/fixtures/plugins/fixture_evaluator_next) whose
schemas refuse `require_enriched` and labels over 8 characters, run by the test as a process."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest

from contentsvc.auth import keys
from contentsvc.auth.principal import Principal
from contentsvc.monitoring import commands
from contentsvc.monitoring import events as me
from contentsvc.processes.local_service import free_port
from tests.conftest import ServerProcess, assert_error, client_for, key_for
from tests.e2e.conftest import (
    DESTINATION,
    EVALUATOR,
    changes,
    corpora,
    feed_start,
    new_org,
    saved_query,
    subscription_body,
)
from tests.e2e.test_subscription_previews import preview, preview_body, searchable
from tests.integration.plugin_processes import PluginProcess

NEXT = Path(__file__).resolve().parents[1] / "fixtures" / "plugins" / "fixture_evaluator_next"
NEXT_MODULE = "tests.fixtures.plugins.fixture_evaluator_next.plugin"
MIGRATIONS = "/v0/admin/subscriptions/evaluator-migrations"


def operator_key(url: str, org: str, corpora: str = "*") -> str:
    """`contentsvc keys create --operator`: plugins:admin plus every organization action on `corpora`."""
    with psycopg.connect(url, autocommit=True) as conn:
        return keys.create_key(conn, org, keys.parse_actions("*", operator=True), keys.parse_corpora(corpora),
                               None).secret


@dataclass
class Deployment:
    folder: Path
    url: str
    secret: str
    server: ServerProcess | None = None
    next_plugin: PluginProcess | None = None
    made: dict = field(default_factory=dict)  # what the tests before the restart created

    def config(self, version: str, endpoint: str, manifest: str, launch: bool) -> Path:
        path = self.folder / f"contentsvc-{version}.toml"
        path.write_text(
            f'[plugins.fixture-evaluator]\nendpoint = "{endpoint}"\nversion = "{version}"\nmanifest = "{manifest}"\n'
            + ('launch = "fixture-evaluator"\n' if launch else "")
            + f'\n[destinations.{DESTINATION}]\nurl = "http://127.0.0.1:{free_port()}/hooks"\n'
              f'secret = "{self.secret}"\n')
        return path

    def start(self, config: Path) -> None:
        home = self.server.home if self.server is not None else None
        if self.server is not None:
            self.server.stop()
        self.server = ServerProcess(self.url, self.folder, {"CONTENTSVC_CONFIG": str(config)}, home=home)

    def client(self, org: str, corpora: str = "*") -> httpx.Client:
        return client_for(self.server, key_for(self.url, org, "*", corpora))

    def admin(self, org: str, corpora: str = "*") -> httpx.Client:
        return client_for(self.server, operator_key(self.url, org, corpora))


@pytest.fixture(scope="module")
def first(databases, tmp_path_factory):
    """Serving fixture-evaluator 0.1.0."""
    folder = tmp_path_factory.mktemp("evaluator-migration")
    (folder / "v1").mkdir()
    shutil.copy(EVALUATOR / "contentsvc-plugin.json", folder / "v1")
    deployment = Deployment(folder, databases.create(), "whsec_" + base64.b64encode(os.urandom(32)).decode())
    deployment.start(deployment.config("0.1.0", f"http://127.0.0.1:{free_port()}", "v1/contentsvc-plugin.json",
                                       launch=True))
    yield deployment
    if deployment.next_plugin is not None:
        deployment.next_plugin.stop()
    deployment.server.stop()


@pytest.fixture(scope="module")
def second(first):
    """The same deployment restarted pinning fixture-evaluator 0.2.0 (the next build)."""
    first.next_plugin = PluginProcess("fixture-evaluator-next", first.folder, module=NEXT_MODULE)
    first.start(first.config("0.2.0", first.next_plugin.base_url, str(NEXT / "contentsvc-plugin.json"),
                             launch=False))
    return first


def subscribe(client: httpx.Client, version_id: str, configuration: dict | None = None) -> str:
    body = subscription_body(version_id)
    body["evaluator"]["configuration"] = configuration or {}
    r = client.post("/v0/subscriptions", json=body)
    assert r.status_code == 201, r.text
    return r.json()["subscription_id"]


def migrate(admin: httpx.Client, **body) -> dict:
    r = admin.post(MIGRATIONS, json={"plugin_id": "fixture-evaluator", "from_version": "0.1.0", **body})
    assert r.status_code == 200, r.text
    return r.json()


def migrate_all(admin: httpx.Client, limit: int) -> tuple[list[dict], list[dict], int]:
    """Calls repeated with next_after until it is absent: (moved, refused, calls)."""
    moved, refused, after, calls = [], [], None, 0
    while True:
        answer = migrate(admin, limit=limit, dry_run=False, **({"after": after} if after else {}))
        calls += 1
        moved += answer["moved"]
        refused += answer["refused"]
        after = answer.get("next_after")
        if after is None:
            return moved, refused, calls


def current_version(client: httpx.Client, subscription_id: str) -> dict:
    sub = client.get(f"/v0/subscriptions/{subscription_id}").json()
    version = client.get(f"/v0/subscriptions/{subscription_id}/versions/{sub['current_version_id']}").json()
    return {**version, "enabled": sub["enabled"]}


def test_refusals_while_the_pinned_version_is_served(first):
    org = new_org()
    admin = first.admin(org)
    # part 2 "Evaluator migration": from_version is the served version: 422 invalid_migration
    r = admin.post(MIGRATIONS, json={"plugin_id": "fixture-evaluator", "from_version": "0.1.0", "dry_run": True})
    assert assert_error(r, 422, "invalid_migration")["field"] == "/from_version"
    # no version of the plugin serves new Subscriptions: 422 unsupported_evaluator
    r = admin.post(MIGRATIONS, json={"plugin_id": "absent-evaluator", "from_version": "1.0.0"})
    assert assert_error(r, 422, "unsupported_evaluator")["field"] == "/plugin_id"
    # part 2 Limits: limit 1..500
    r = admin.post(MIGRATIONS, json={"plugin_id": "fixture-evaluator", "from_version": "0.0.1", "limit": 501})
    assert_error(r, 422, "invalid_schema")
    # part 2 "Plugin administration": an operator action organization keys do not get
    r = first.client(org).post(MIGRATIONS, json={"plugin_id": "fixture-evaluator", "from_version": "0.0.1"})
    assert_error(r, 403, "forbidden")


def test_make_subscriptions_on_the_first_version(first):
    """What the migration tests after the restart move; made while 0.1.0 serves new Subscriptions."""
    org = new_org()
    client = first.client(org)
    [a, b] = corpora(client, 2)
    cranes = saved_query(client, [a], {"contains": "crane"})["current_version_id"]
    enriched = saved_query(client, [a], {"contains": "crane", "require_enriched": True})["current_version_id"]
    evolving = saved_query(client, [a], {"contains": "hull"})
    wide = saved_query(client, [a, b], {"contains": "crane"})["current_version_id"]
    made = {"org": org, "a": a, "b": b,
            "moves": subscribe(client, cranes),
            "disabled": subscribe(client, cranes, {"label": "short"}),
            "bad_expression": subscribe(client, enriched),
            "bad_configuration": subscribe(client, cranes, {"label": "much-too-long"}),
            "earlier_query_version": subscribe(client, evolving["current_version_id"]),
            "deleted": subscribe(client, cranes),
            "wide": subscribe(client, wide)}
    assert client.post(f"/v0/subscriptions/{made['disabled']}/disable").status_code == 200
    assert client.post(f"/v0/subscriptions/{made['deleted']}/delete").status_code == 200
    # the Saved Query moves on: the Subscription keeps pinning a Version that is no longer current
    r = client.post(f"/v0/saved-queries/{evolving['saved_query_id']}/versions",
                    json={"idempotency_key": uuid.uuid4().hex, "expression": {"contains": "keel"}})
    assert r.status_code == 201, r.text
    other_org = new_org()
    other = first.client(other_org)
    [c] = corpora(other, 1)
    made["other_org"] = other_org
    made["other"] = subscribe(other, saved_query(other, [c])["current_version_id"])
    race_org = new_org()
    racing = first.client(race_org)
    [d] = corpora(racing, 1)
    race_query = saved_query(racing, [d])["current_version_id"]
    made["race_org"] = race_org
    made["race"] = [subscribe(racing, race_query) for _ in range(12)]
    first.made = made


def test_migration_moves_validates_pages_and_converges(second):
    made = second.made
    org, a = made["org"], made["a"]
    client = second.client(org)
    admin = second.admin(org, corpora=a)  # leaves out `wide`, whose Corpora it does not all grant
    before = {name: current_version(client, made[name]) for name in
              ("moves", "disabled", "bad_expression", "bad_configuration", "earlier_query_version", "wide")}

    # dry_run lists without moving; `limit` pages in Subscription id order with next_after
    dry = migrate(admin, dry_run=True, limit=2)
    assert dry["plugin_id"] == "fixture-evaluator" and dry["from_version"] == "0.1.0"
    assert dry["to_version"] == "0.2.0" and dry["dry_run"] is True
    assert [m["subscription_id"] for m in dry["moved"]] == [made["moves"], made["disabled"]]
    assert all("version_id" not in m for m in dry["moved"]) and dry["refused"] == []
    assert dry["next_after"] == made["disabled"]
    assert {name: current_version(client, made[name])["version_id"] for name in before} == {
        name: v["version_id"] for name, v in before.items()}

    cursor = feed_start(client, a)
    moved, refused, calls = migrate_all(admin, limit=2)
    assert calls == 3
    # moved: enabled or disabled, also one pinning a Saved Query Version no longer current;
    # a deleted one is not listed, `wide` is left out
    assert [m["subscription_id"] for m in moved] == [made["moves"], made["disabled"], made["earlier_query_version"]]
    # refused with rule 6's codes and fields; they keep their version
    assert [(r["subscription_id"], r["code"], r.get("field")) for r in refused] == [
        (made["bad_expression"], "invalid_expression", "/saved_query_version_id"),
        (made["bad_configuration"], "invalid_subscription_configuration", "/evaluator/configuration/label")]
    assert all(r["version_id"] == before[n]["version_id"] and r["message"]
               for r, n in zip(refused, ("bad_expression", "bad_configuration")))
    for name in ("bad_expression", "bad_configuration", "wide"):
        assert current_version(client, made[name])["evaluator"]["version"] == "0.1.0"

    for m, name in zip(moved, ("moves", "disabled", "earlier_query_version")):
        now = current_version(client, made[name])
        # a new current Version: same Saved Query Version, configuration and destination, the served version
        assert m["from_version_id"] == before[name]["version_id"] and now["version_id"] == m["version_id"]
        assert now["evaluator"] == {**before[name]["evaluator"], "version": "0.2.0"}
        assert now["saved_query_version_id"] == before[name]["saved_query_version_id"]
        assert now["destination_id"] == before[name]["destination_id"] and now["enabled"] == before[name]["enabled"]
        # the earlier Version stays readable
        old = client.get(f"/v0/subscriptions/{made[name]}/versions/{before[name]['version_id']}")
        assert old.status_code == 200 and old.json()["evaluator"]["version"] == "0.1.0"

    # subscription.updated in each Corpus of a moved Subscription
    deadline, seen = time.time() + 20, set()
    while not {made["moves"], made["earlier_query_version"]} <= seen and time.time() < deadline:
        items, cursor = changes(client, a, cursor)
        seen |= {e["subject"]["id"] for e in items if e["kind"] == "subscription.updated"}
        time.sleep(0.2)
    assert {made["moves"], made["disabled"], made["earlier_query_version"]} <= seen
    assert not {made["bad_expression"], made["bad_configuration"]} & seen

    # converges: repeating moves nothing more, the refused stay refused
    again = migrate(admin, dry_run=False)
    assert again["moved"] == [] and [r["subscription_id"] for r in again["refused"]] == [
        made["bad_expression"], made["bad_configuration"]]
    assert "next_after" not in again
    # a key granting every Corpus moves `wide` too; another Organization's Subscription never moves
    wide = migrate(second.admin(org), dry_run=False)
    assert [m["subscription_id"] for m in wide["moved"]] == [made["wide"]]
    other = second.client(made["other_org"])
    assert current_version(other, made["other"])["evaluator"]["version"] == "0.1.0"
    # new Subscriptions pin the served version only (rule 6)
    r = client.post("/v0/subscriptions", json=subscription_body(before["moves"]["saved_query_version_id"]))
    assert assert_error(r, 422, "unsupported_evaluator")["field"] == "/evaluator/version"


def test_concurrent_migrations_move_each_subscription_once(second):
    # part 2: "Each call moves a Subscription at most once"; one listed by a call but moved by another
    # meanwhile is refused subscription_changed, never moved twice
    made = second.made
    answers: list[dict] = []

    def run():
        with second.admin(made["race_org"]) as admin:
            answers.append(migrate(admin, dry_run=False))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(answers) == 2
    moved = [m["subscription_id"] for answer in answers for m in answer["moved"]]
    assert sorted(moved) == sorted(made["race"])
    assert {r["code"] for answer in answers for r in answer["refused"]} <= {"subscription_changed"}
    client = second.client(made["race_org"])
    assert {current_version(client, s)["evaluator"]["version"] for s in made["race"]} == {"0.2.0"}


def test_a_subscription_changed_since_it_was_listed_is_not_moved(second):
    # part 2: subscription_changed "when the Subscription got another Version during the call": the
    # move commits only while the current Version is the one the call listed
    made = second.made
    client = second.client(made["org"])
    listed = current_version(client, made["bad_expression"])["version_id"]
    stale = "subv_listed_before_a_change"
    principal = Principal(key_id="key_test", org_id=made["org"], actions=frozenset({"plugins:admin"}), corpora=None)
    evaluator = me.Evaluator(plugin_id="fixture-evaluator", version="0.2.0", configuration={})

    async def repin():
        async with await psycopg.AsyncConnection.connect(second.url, autocommit=True) as conn:
            return await commands.repin_evaluator(conn, principal, made["bad_expression"], stale, evaluator)

    assert asyncio.run(repin()) is None
    assert current_version(client, made["bad_expression"])["version_id"] == listed


def test_preview_with_the_evaluator_unreachable(second):
    made = second.made
    client = second.client(made["org"])
    searchable(client, made["a"], "r-1", "A crane.")
    query = saved_query(client, [made["a"]])
    body = {**preview_body(query["current_version_id"]),
            "evaluator": {"plugin_id": "fixture-evaluator", "version": "0.2.0", "configuration": {}}}
    r = preview(client, body)
    assert r.status_code == 200 and r.json()["matched"] == 1, r.text
    second.next_plugin.stop()
    # decisions-part2 "Preview": evaluator unreachable: 503 evaluator_unavailable with Retry-After
    r = preview(client, body)
    assert assert_error(r, 503, "evaluator_unavailable")["retryable"] is True
    assert int(r.headers["retry-after"]) >= 1
