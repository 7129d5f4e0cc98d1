"""Deliveries over a real server (`contentsvc run`, its `deliveries` worker included) and a real
receiver verifying every request with the Standard Webhooks reference implementation: getDelivery,
listDeliveryAttempts (part 2 endpoints table, rule 8; decisions-part2 "Deliveries"), the holds a
Subscription's disable, enable and delete move (part 2 "Subscription" states; decisions-part2
"Deliveries"), and `delivery.changed` on the change feed (decisions-part2 "Change-feed event kinds
added").

The evaluator is not part of this: each notice is committed through the store
(monitoring/deliveries.py) in the server's database, as the evaluator commits it, naming a
Subscription created through the API, so authorization runs against real Corpora. The store is
given the schedule each test needs (a first attempt due at once, or in an hour so that it stays
pending; a short window); the server's own schedule retries after 1 s. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from datetime import datetime, timezone

import pytest
from psycopg import AsyncConnection

from contentsvc.config.settings import DeliverySettings
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.monitoring import deliveries as store
from tests.e2e.conftest import (
    DESTINATION,
    corpora,
    changes,
    feed_start,
    kinds_until,
    new_org,
    saved_query,
    start_monitoring,
    subscription_body,
    version_body,
)
from tests.integration.webhook_receiver import Answer, WebhookReceiver

SECRET = "whsec_" + base64.b64encode(b"deliveries-api-test-secret-0123").decode()
SERVER_SCHEDULE = "[deliveries]\nretry_schedule = [0, 1, 1]\njitter = 0.0\nattempt_timeout_seconds = 2\n"
AT_ONCE = DeliverySettings(retry_schedule=[0], window_seconds=3600)
IN_AN_HOUR = DeliverySettings(retry_schedule=[3600], window_seconds=7200)  # stays pending through a test
DELIVERY_FIELDS = {"delivery_id", "event_id", "match_id", "subscription_id", "destination_id", "event_type", "state",
                   "held", "attempts", "next_attempt_at", "last_attempt_at", "succeeded_at", "failed_at",
                   "last_error", "created_at", "window_ends_at"}
ATTEMPT_FIELDS = {"attempt_id", "delivery_id", "number", "started_at", "finished_at", "status_code", "error_code",
                  "duration_ms", "response_excerpt"}


@pytest.fixture(scope="module")
def receiver():
    r = WebhookReceiver(SECRET)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory, receiver):
    """A server of its own: its destination is this module's receiver (the session's monitoring
    server names a destination nobody listens on)."""
    d = start_monitoring(databases, tmp_path_factory.mktemp("deliveries-api"), receiver.url, SECRET,
                         SERVER_SCHEDULE)
    yield d
    d.server.stop()


def subscription(client, corpus_ids: list[str]) -> dict:
    query = saved_query(client, corpus_ids)
    r = client.post("/v0/subscriptions", json=subscription_body(query["current_version_id"]))
    assert r.status_code == 201, r.text
    return r.json()


def commit_notice(deployment, org: str, sub: dict, corpus_id: str, settings: DeliverySettings = AT_ONCE,
                  event_type: str = store.MATCH_CREATED) -> dict:
    """A Match's notice, committed as the evaluator commits it: held as the Subscription is now."""
    tag = uuid.uuid4().hex[:10]
    version = deployment.client(org).get(
        f"/v0/subscriptions/{sub['subscription_id']}/versions/{sub['current_version_id']}").json()
    notice = store.Notice(org_id=org, corpus_id=corpus_id, match_id=f"mat_{tag}",
                          subscription_id=sub["subscription_id"], subscription_version_id=version["version_id"],
                          saved_query_id=version["saved_query_id"],
                          saved_query_version_id=version["saved_query_version_id"], record_id=f"rec_{tag}",
                          version_id=f"ver_{tag}", destination_id=DESTINATION, event_type=event_type)

    async def create() -> store.Delivery:
        async with await AsyncConnection.connect(deployment.url) as conn:
            async with journal_transaction(conn):
                held = await store.notice_hold(conn, notice.subscription_id)
                return await store.create_delivery(conn, notice, settings, held)

    return {"delivery_id": asyncio.run(create()).delivery_id, "match_id": notice.match_id}


def get(client, delivery_id: str) -> dict:
    r = client.get(f"/v0/deliveries/{delivery_id}")
    assert r.status_code == 200, r.text
    assert set(r.json()) <= DELIVERY_FIELDS, r.json()
    return r.json()


def wait_for(client, delivery_id: str, done, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = get(client, delivery_id)
        if done(found):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.2)


def settled(d: dict) -> bool:
    return d["state"] != "pending"


def attempts(client, delivery_id: str, **params) -> dict:
    r = client.get(f"/v0/deliveries/{delivery_id}/attempts", params=params)
    assert r.status_code == 200, r.text
    for item in r.json()["items"]:
        assert set(item) <= ATTEMPT_FIELDS, item
    return r.json()


def test_a_delivery_sent_by_the_worker_reads_with_its_attempts(deployment, receiver):
    org = new_org()
    client = deployment.client(org)
    [a, b] = corpora(client, 2)
    sub = subscription(client, [a, b])
    # two refusals, then acceptance: three attempts (server schedule [0, 1, 1])
    receiver.answer_next(Answer(status=500, body=b"busy"), Answer(status=503, body=b"later"))
    created = commit_notice(deployment, org, sub, a)
    d = wait_for(client, created["delivery_id"], settled)
    # decisions-part2 "Deliveries": the Delivery's fields; 2xx -> succeeded; no hold, nothing due
    assert d["state"] == "succeeded" and d["attempts"] == 3, d
    assert d["delivery_id"] == created["delivery_id"] and d["match_id"] == created["match_id"]
    assert d["subscription_id"] == sub["subscription_id"] and d["destination_id"] == DESTINATION
    assert d["event_type"] == "match.created" and d["event_id"].startswith("wev_")
    assert {"succeeded_at", "last_attempt_at", "created_at", "window_ends_at"} <= set(d)
    assert not {"held", "next_attempt_at", "failed_at", "last_error"} & set(d)  # a success clears last_error
    # part 2 Events: every request carried a valid Standard Webhooks signature, webhook-id = event_id
    sent = receiver.requests_for(d["event_id"])
    assert len(sent) == 3 and all(r.verified for r in sent), [r.error for r in sent]

    # decisions-part2 "Deliveries": listDeliveryAttempts in ascending number, paged
    first = attempts(client, d["delivery_id"], limit=2)
    assert [x["number"] for x in first["items"]] == [1, 2] and first["next_page_cursor"]
    rest = attempts(client, d["delivery_id"], limit=2, page_cursor=first["next_page_cursor"])
    assert [x["number"] for x in rest["items"]] == [3] and "next_page_cursor" not in rest
    one, two, three = first["items"] + rest["items"]
    assert one["status_code"] == 500 and one["error_code"] == "http_status" and one["response_excerpt"] == "busy"
    assert two["status_code"] == 503 and two["response_excerpt"] == "later"
    assert three["status_code"] == 200 and "error_code" not in three and three["response_excerpt"] == "ok"
    assert all(x["delivery_id"] == d["delivery_id"] and x["duration_ms"] >= 0 for x in (one, two, three))
    assert attempts(client, d["delivery_id"])["items"] == first["items"] + rest["items"]

    # decisions.md "Cursors": another route's cursor is 422 invalid_cursor; one bound to another
    # Delivery (or scope) is 409 cursor_scope_changed
    other = commit_notice(deployment, org, sub, a, IN_AN_HOUR)
    r = client.get(f"/v0/deliveries/{other['delivery_id']}/attempts",
                   params={"page_cursor": first["next_page_cursor"]})
    assert r.status_code == 409 and r.json()["code"] == "cursor_scope_changed", r.text
    assert r.json()["resync_url"] == f"/v0/deliveries/{other['delivery_id']}/attempts"
    r = client.get(f"/v0/deliveries/{d['delivery_id']}/attempts", params={"page_cursor": "garbage"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_cursor", r.text
    # a pending Delivery not yet attempted: its next attempt is due, it has no attempt
    pending = get(client, other["delivery_id"])
    assert pending["state"] == "pending" and pending["attempts"] == 0 and "next_attempt_at" in pending
    assert attempts(client, other["delivery_id"]) == {"items": []}


def test_reading_needs_every_corpus_any_version_pinned(deployment):
    org = new_org()
    client = deployment.client(org)
    [a, b, c] = corpora(client, 3)
    query = saved_query(client, [a])
    r = client.post("/v0/subscriptions", json=subscription_body(query["current_version_id"]))
    sub = r.json()
    # a new Version of the Saved Query on b, pinned by a new Subscription Version: the Subscription
    # has pinned a (first Version) and b (current one)
    r = client.post(f"/v0/saved-queries/{query['saved_query_id']}/versions",
                    json={"idempotency_key": uuid.uuid4().hex, "corpus_ids": [b], "expression": {"contains": "x"}})
    assert r.status_code == 201, r.text
    r = client.post(f"/v0/subscriptions/{sub['subscription_id']}/versions",
                    json=version_body(r.json()["version_id"]))
    assert r.status_code == 201, r.text
    d = commit_notice(deployment, org, sub, a, IN_AN_HOUR)["delivery_id"]
    paths = [f"/v0/deliveries/{d}", f"/v0/deliveries/{d}/attempts"]

    def status(key_client) -> list[tuple[int, str | None]]:
        return [(r.status_code, r.json().get("code")) for r in map(key_client.get, paths)]

    # part 2 rule 8: grants on every Corpus any of its Versions pinned
    assert status(deployment.client(org, corpora=f"{a},{b}")) == [(200, None), (200, None)]
    for partial in (a, b, f"{b},{c}"):  # the current Version's Corpora alone are not enough
        assert status(deployment.client(org, corpora=partial)) == [(404, "not_found")] * 2, partial
    # another Organization's key reads it as absent, like an unknown id
    assert status(deployment.client(new_org())) == [(404, "not_found")] * 2
    assert client.get("/v0/deliveries/dlv_unknown").json()["code"] == "not_found"
    assert client.get("/v0/deliveries/dlv_unknown/attempts").status_code == 404
    # part 2 endpoints table: monitoring:read is required (part 1 Errors: 403 forbidden)
    assert status(deployment.client(org, actions="monitoring:write,changes:read")) == [(403, "forbidden")] * 2
    assert status(deployment.client(org, actions="monitoring:read")) == [(200, None), (200, None)]


def delivery_events(client, corpus_id: str, cursor: str, delivery_id: str) -> list[dict]:
    items, _ = changes(client, corpus_id, cursor)
    return [e for e in items if e["subject"] == {"type": "delivery", "id": delivery_id}]


def wait_for_events(client, corpus_id: str, cursor: str, delivery_id: str, n: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        found = delivery_events(client, corpus_id, cursor, delivery_id)
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_disable_holds_and_enable_releases(deployment, receiver):
    org = new_org()
    client = deployment.client(org)
    [a] = corpora(client, 1)
    sub = subscription(client, [a])
    sid = sub["subscription_id"]
    waiting = commit_notice(deployment, org, sub, a, IN_AN_HOUR)["delivery_id"]
    short = commit_notice(deployment, org, sub, a, DeliverySettings(retry_schedule=[3600], window_seconds=1))
    cursor = feed_start(client, a)
    blind = deployment.client(org, actions="changes:read")  # no monitoring:read
    blind_cursor = feed_start(blind, a)

    assert client.post(f"/v0/subscriptions/{sid}/disable").status_code == 200
    # decisions-part2 "Deliveries": disable holds every pending Delivery subscription_disabled, parked
    for delivery_id in (waiting, short["delivery_id"]):
        d = get(client, delivery_id)
        assert d["state"] == "pending" and d["held"] == "subscription_disabled" and "next_attempt_at" not in d, d
    # part 2 Events: a match.withdrawn notice is committed for a disabled Subscription, pending and
    # held; decisions-part2: it has no window until the re-enable
    withdrawn = commit_notice(deployment, org, sub, a, AT_ONCE, "match.withdrawn")["delivery_id"]
    d = get(client, withdrawn)
    assert d["held"] == "subscription_disabled" and "window_ends_at" not in d and "next_attempt_at" not in d, d
    # decisions-part2 "Deliveries": each held change commits delivery.changed (Corpus of the Match,
    # subject delivery), visible with monitoring:read only ("Change-feed event kinds added")
    events = wait_for_events(client, a, cursor, waiting, 1)
    assert [e["kind"] for e in events] == ["delivery.changed"], events
    assert changes(blind, a, blind_cursor)[0] == []

    # the short window passes while disabled
    window = datetime.fromisoformat(get(client, short["delivery_id"])["window_ends_at"].replace("Z", "+00:00"))
    while datetime.now(timezone.utc) <= window:
        time.sleep(0.1)
    time.sleep(0.5)
    assert all(not receiver.requests_for(get(client, x)["event_id"]) for x in (waiting, withdrawn))

    # enable: held ones are due at once and sent; past its window, failed without an attempt
    assert client.post(f"/v0/subscriptions/{sid}/enable").status_code == 200
    expired = get(client, short["delivery_id"])
    assert expired["state"] == "failed" and expired["last_error"]["code"] == "delivery_window_expired", expired
    assert expired["attempts"] == 0 and "held" not in expired and "failed_at" in expired
    assert attempts(client, short["delivery_id"])["items"] == []
    for delivery_id in (waiting, withdrawn):
        d = wait_for(client, delivery_id, settled)
        assert d["state"] == "succeeded" and d["attempts"] == 1 and "held" not in d, d
        [sent] = receiver.requests_for(d["event_id"])
        assert sent.verified, sent.error
    # the withdrawn notice's window started at the re-enable (decisions-part2 "Deliveries")
    assert "window_ends_at" in get(client, withdrawn)
    # disable, enable and the worker's success: one delivery.changed per move of the waiting one
    events = wait_for_events(client, a, cursor, waiting, 3)
    assert [e["kind"] for e in events] == ["delivery.changed"] * 3, events


def test_delete_holds_for_good(deployment, receiver):
    org = new_org()
    client = deployment.client(org)
    [a] = corpora(client, 1)
    sub = subscription(client, [a])
    sid = sub["subscription_id"]
    pending = commit_notice(deployment, org, sub, a, IN_AN_HOUR)["delivery_id"]
    parked = commit_notice(deployment, org, sub, a, IN_AN_HOUR)["delivery_id"]
    assert client.post(f"/v0/subscriptions/{sid}/disable").status_code == 200
    assert get(client, parked)["held"] == "subscription_disabled"

    r = client.post(f"/v0/subscriptions/{sid}/delete")
    assert r.status_code == 200 and r.json()["deleted"] is True
    # decisions-part2 "Deliveries": delete sets subscription_deleted on every pending Delivery, the
    # disabled-held ones included; part 2 "Subscription": its Deliveries stay readable
    for delivery_id in (pending, parked):
        d = get(client, delivery_id)
        assert d["state"] == "pending" and d["held"] == "subscription_deleted" and "next_attempt_at" not in d, d
    # part 2 "Subscription" delete: a match.withdrawn notice is still committed with its pending
    # Delivery, but never attempted
    withdrawn = commit_notice(deployment, org, sub, a, AT_ONCE, "match.withdrawn")["delivery_id"]
    assert get(client, withdrawn)["held"] == "subscription_deleted"
    # never cleared: enable is 409 subscription_deleted and the holds stay
    r = client.post(f"/v0/subscriptions/{sid}/enable")
    assert r.status_code == 409 and r.json()["code"] == "subscription_deleted"
    time.sleep(1.5)  # the worker polls at least every second: it would have sent a due one by now
    for delivery_id in (pending, parked, withdrawn):
        d = get(client, delivery_id)
        assert d["state"] == "pending" and d["held"] == "subscription_deleted" and d["attempts"] == 0, d
        assert not receiver.requests_for(d["event_id"])
        assert attempts(client, delivery_id)["items"] == []


def test_a_notice_committed_during_a_disable_is_held(deployment):
    # decisions-part2 "Deliveries": disable holds every pending Delivery, and a notice committed for
    # a disabled Subscription is held; a notice whose transaction read the Subscription enabled
    # before the disable committed is among those the disable holds (docs/decisions.md "Hold ordering")
    import threading

    import psycopg

    org = new_org()
    client = deployment.client(org)
    [a] = corpora(client, 1)
    feed_start_of_org = feed_start(client, a)
    sub = subscription(client, [a])
    sid = sub["subscription_id"]
    version = client.get(f"/v0/subscriptions/{sid}/versions/{sub['current_version_id']}").json()
    tag = uuid.uuid4().hex[:10]
    notice = store.Notice(org_id=org, corpus_id=a, match_id=f"mat_{tag}", subscription_id=sid,
                          subscription_version_id=version["version_id"], saved_query_id=version["saved_query_id"],
                          saved_query_version_id=version["saved_query_version_id"], record_id=f"rec_{tag}",
                          version_id=f"ver_{tag}", destination_id=DESTINATION, event_type=store.MATCH_CREATED)
    answers: list = []
    disable = threading.Thread(target=lambda: answers.append(client.post(f"/v0/subscriptions/{sid}/disable")))

    def waiting_on(pid: int) -> list[str]:
        """The statements touching Subscriptions that wait for the backend `pid`."""
        with psycopg.connect(deployment.url, autocommit=True) as conn:
            rows = conn.execute("SELECT query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                (pid,)).fetchall()
        return [q for (q,) in rows if "subscriptions" in q]

    # the readmodel projector has folded the creation: it touches the Subscription's row no more
    assert [e["kind"] for e in kinds_until(client, a, feed_start_of_org, ["saved_query.updated",
                                                                          "subscription.updated"])] \
        == ["saved_query.updated", "subscription.updated"]

    async def evaluate() -> str:
        async with await AsyncConnection.connect(deployment.url) as conn:
            async with journal_transaction(conn):
                held = await store.notice_hold(conn, sid)
                assert held is None  # enabled when this transaction read it
                disable.start()
                deadline = time.monotonic() + 20
                # the disable waits for this transaction
                while not await asyncio.to_thread(waiting_on, conn.info.backend_pid):
                    assert time.monotonic() < deadline, "the disable did not wait"
                    await asyncio.sleep(0.05)
                return (await store.create_delivery(conn, notice, IN_AN_HOUR, held)).delivery_id

    delivery_id = asyncio.run(evaluate())
    disable.join(timeout=30)
    assert answers and answers[0].status_code == 200, answers
    d = get(client, delivery_id)
    assert d["state"] == "pending" and d["held"] == "subscription_disabled" and "next_attempt_at" not in d, d
