"""Monitoring under faults, over one real `contentsvc run` (its supervisor launching the fixture
evaluator, the `monitor` and `deliveries` workers) and real webhook receivers that verify every
request with the Standard Webhooks reference implementation (tests/integration/webhook_receiver.py).

- The `monitor` and `deliveries` workers are killed with SIGKILL, again and again, while matching
  Records are ingested (the supervisor restarts them): every Match exists once and reaches the
  receiver at least once (design.md "Part 2": calls outside transactions, results committed
  idempotently; decisions-part2 "Deliveries": at least once, the same `webhook-id`). The default
  run floods 200 Records; the 1,000-Record soak runs under `make test-slow` (about 80 s here).
- Receiver faults on the real server path: a refusal then acceptance, a receiver hanging past the
  attempt timeout, 410, Retry-After (decisions-part2 "Deliveries").
- Disable, enable and delete with real Matches (part 2 "Subscription" states; decisions-part2
  "Deliveries").

Each destination has a receiver of its own, so one test's answers never reach another's
Deliveries. Every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import shutil
import time
import uuid
from datetime import datetime

import httpx
import psycopg
import pytest

from contentsvc.processes.local_service import free_port
from tests.conftest import until, ServerProcess, client_for, create_corpus, key_for, text_command, wait_current, \
    wait_resolved, worker_status_rows
from tests.e2e.conftest import EVALUATOR, EVALUATOR_VERSION
from tests.integration.webhook_receiver import Answer, WebhookReceiver

SECRET = "whsec_" + base64.b64encode(b"monitoring-faults-test-secret-01").decode()
ATTEMPT_TIMEOUT_S = 2  # short: a hanging receiver times out soon, a killed sender's lease (timeout + 5 s) expires soon
RETRY_AFTER_S = 3  # above the schedule's 1 s, so an honoured Retry-After shows
SERVER_TOML = ("[deliveries]\nretry_schedule = [0, 1, 1, 1, 1, 1, 1, 1]\njitter = 0.0\n"
               f"attempt_timeout_seconds = {ATTEMPT_TIMEOUT_S}\n")
# One receiver (and destination) per test: "flood" for the kill test, one per receiver fault.
DESTINATIONS = ("flood", "flaky", "hanging", "gone", "later", "paused", "deleted")
DEADLINE_S = 40
FLOOD_DEADLINE_S = 300
BATCH = 100  # POST /v0/records/batch holds at most 100 entries
KILLS_PER_WORKER = 3
# The flood receiver takes a moment over each answer, as a real one does: a sender killed then is
# most likely mid-attempt (sent, not yet recorded), the case a lease must redo.
FLOOD_ANSWER = Answer(delay_seconds=0.05)


class Deployment:
    def __init__(self, server: ServerProcess, url: str, receivers: dict[str, WebhookReceiver]) -> None:
        self.server, self.url, self.receivers = server, url, receivers

    def client(self, org: str) -> httpx.Client:
        return client_for(self.server, key_for(self.url, org))


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("monitoring-faults")
    (folder / "fixture-evaluator").mkdir()
    shutil.copy(EVALUATOR / "contentsvc-plugin.json", folder / "fixture-evaluator")
    receivers = {name: WebhookReceiver(SECRET) for name in DESTINATIONS}
    destinations = "".join(f'[destinations.{name}]\nurl = "{r.url}"\nsecret = "{SECRET}"\n\n'
                           for name, r in receivers.items())
    config = folder / "contentsvc.toml"
    config.write_text(
        f'[plugins.fixture-evaluator]\nendpoint = "http://127.0.0.1:{free_port()}"\n'
        f'version = "{EVALUATOR_VERSION}"\nmanifest = "fixture-evaluator/contentsvc-plugin.json"\n'
        f'launch = "fixture-evaluator"\n\n{destinations}{SERVER_TOML}')
    url = databases.create()
    server = ServerProcess(url, folder, {"CONTENTSVC_CONFIG": str(config)})
    yield Deployment(server, url, receivers)
    server.stop()
    for r in receivers.values():
        r.stop()


@pytest.fixture
def api(deployment):
    with deployment.client(f"org-{uuid.uuid4().hex[:8]}") as client:
        yield client


# ---------------------------------------------------------------- helpers


def subscribe(api: httpx.Client, corpus_id: str, destination: str) -> dict:
    r = api.post("/v0/saved-queries", json={"idempotency_key": uuid.uuid4().hex, "name": "Cranes",
                                            "corpus_ids": [corpus_id], "expression": {"contains": "crane"}})
    assert r.status_code == 201, r.text
    r = api.post("/v0/subscriptions", json={
        "idempotency_key": uuid.uuid4().hex, "name": f"Cranes to {destination}",
        "saved_query_version_id": r.json()["current_version_id"],
        "evaluator": {"plugin_id": "fixture-evaluator", "version": EVALUATOR_VERSION, "configuration": {}},
        "destination_id": destination})
    assert r.status_code == 201, r.text
    return r.json()


def ingest(api: httpx.Client, corpus_id: str, record_key: str, text: str) -> dict:
    r = api.post("/v0/records", json=text_command(corpus_id, record_key, text))
    assert r.status_code == 202, r.text
    return wait_current(api, wait_resolved(api, r.json()["receipt_id"]))


def match_of(api: httpx.Client, subscription_id: str, record_id: str) -> dict:
    def found():
        r = api.get("/v0/matches", params={"subscription_id": subscription_id, "record_id": record_id})
        assert r.status_code == 200, r.text
        return r.json()["items"]
    [match] = until(found, "the Match")
    return match


def delivery_id_of(match: dict, event_type: str = "match.created") -> str:
    [ref] = [d for d in match["deliveries"] if d["event_type"] == event_type]
    return ref["delivery_id"]


def delivery(api: httpx.Client, delivery_id: str) -> dict:
    r = api.get(f"/v0/deliveries/{delivery_id}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_delivery(api: httpx.Client, delivery_id: str, done, what: str, timeout: float = DEADLINE_S) -> dict:
    def probe():
        d = delivery(api, delivery_id)
        return d if done(d) else None
    return until(probe, what, timeout)


def attempts(api: httpx.Client, delivery_id: str) -> list[dict]:
    r = api.get(f"/v0/deliveries/{delivery_id}/attempts", params={"limit": 100})
    assert r.status_code == 200, r.text
    return r.json()["items"]


def matched_delivery(api: httpx.Client, destination: str) -> tuple[dict, str]:
    """A Subscription to `destination`, a matching Record, its Match: the match.created Delivery's id."""
    corpus = create_corpus(api)
    sub = subscribe(api, corpus, destination)
    record = ingest(api, corpus, "one", "A crane on the quay.")
    match = match_of(api, sub["subscription_id"], record["record_id"])
    return match, delivery_id_of(match)


def at(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00"))


def worker_pid(server: ServerProcess, name: str) -> int | None:
    """The supervised child running `contentsvc worker run NAME`, if one is alive."""
    child = server.children().get(f"worker:{name}")
    return child.pid if child else None


# ---------------------------------------------------------------- kill -9 while ingesting


class KillPlan:
    """SIGKILLs one worker each time its progress passes the next threshold, once the supervisor
    has restarted it after the previous kill (src/contentsvc/processes/supervisor.py)."""

    def __init__(self, server: ServerProcess, worker: str, thresholds: list[int]) -> None:
        self.server, self.worker, self.thresholds = server, worker, thresholds
        self.killed: list[int] = []
        self.progress_at_kill: list[int] = []

    def step(self, progress: int) -> None:
        if len(self.killed) == len(self.thresholds) or progress < self.thresholds[len(self.killed)]:
            return
        pid = worker_pid(self.server, self.worker)
        if pid is None or pid in self.killed:
            return  # still being restarted
        os.kill(pid, signal.SIGKILL)
        self.killed.append(pid)
        self.progress_at_kill.append(progress)

    @property
    def done(self) -> bool:
        return len(self.killed) == len(self.thresholds)


def progress(conn: psycopg.Connection, subscription_id: str) -> tuple[int, int]:
    """(Matches of the Subscription, of them with a succeeded match.created Delivery)."""
    return conn.execute(
        "SELECT (SELECT count(*) FROM matches WHERE subscription_id = %s),"
        " (SELECT count(*) FROM deliveries WHERE subscription_id = %s AND event_type = 'match.created'"
        "  AND state = 'succeeded')", (subscription_id, subscription_id)).fetchone()


def flood_under_kills(deployment: Deployment, records: int) -> None:
    receiver = deployment.receivers["flood"]
    receiver.default = FLOOD_ANSWER
    with deployment.client(f"org-{uuid.uuid4().hex[:8]}") as api, \
            psycopg.connect(deployment.url, autocommit=True) as watch:  # one connection for the polling
        corpus = create_corpus(api)
        sub = subscribe(api, corpus, "flood")
        sid = sub["subscription_id"]
        batches = [[text_command(corpus, f"r{i:05d}", f"Crane report number {i}.")
                    for i in range(start, min(start + BATCH, records))] for start in range(0, records, BATCH)]
        # Kills spread over the run: each worker at 5 %, 35 % and 65 % of its own progress.
        shares = [0.05, 0.35, 0.65][:KILLS_PER_WORKER]
        monitor = KillPlan(deployment.server, "monitor", [max(1, int(records * s)) for s in shares])
        sender = KillPlan(deployment.server, "deliveries", [max(1, int(records * s)) for s in shares])
        deadline = time.monotonic() + FLOOD_DEADLINE_S
        while True:
            if batches:  # one batch per turn: the kills land while Records are still arriving
                r = api.post("/v0/records/batch", json={"entries": batches.pop(0)})
                assert r.status_code == 200, r.text
                assert all(item["status"] == 202 for item in r.json()["items"]), r.text
            matched, delivered = progress(watch, sid)
            monitor.step(matched)
            sender.step(delivered)
            if not batches and monitor.done and sender.done and delivered == records:
                break
            assert time.monotonic() < deadline, (f"timed out: {matched} Matches, {delivered} delivered,"
                                                 f" kills {monitor.progress_at_kill} {sender.progress_at_kill}")
            time.sleep(0.1)
        # Each kill came while that worker still had work: the test killed what it says it killed.
        assert all(p < records for p in monitor.progress_at_kill + sender.progress_at_kill), \
            (monitor.progress_at_kill, sender.progress_at_kill)

        # One Match per Record, none missing (listMatches, every page)
        listed, cursor = [], None
        while True:
            params = {"subscription_id": sid, "limit": 100} | ({"page_cursor": cursor} if cursor else {})
            r = api.get("/v0/matches", params=params)
            assert r.status_code == 200, r.text
            listed += r.json()["items"]
            cursor = r.json().get("next_page_cursor")
            if not cursor:
                break
        assert len(listed) == records
        assert len({m["record_id"] for m in listed}) == records  # no Record matched twice
        assert len({m["version_id"] for m in listed}) == records
        assert all(m["state"] == "active" for m in listed)
        # decisions-part2 "Deliveries": one Delivery per (Match, event type)
        assert all([d["event_type"] for d in m["deliveries"]] == ["match.created"] for m in listed)
        # the database agrees, and no evaluation pair was decided twice (one evaluation per
        # (Subscription Version, Record Version), decisions-part2 "Evaluation trigger and eligibility")
        assert watch.execute("SELECT count(*), count(DISTINCT (subscription_version_id, version_id))"
                             " FROM matches WHERE subscription_id = %s", (sid,)).fetchone() == (records, records)
        events = dict(watch.execute("SELECT match_id, event_id FROM deliveries WHERE subscription_id = %s",
                                    (sid,)).fetchall())
        # decisions-part2 "Matches": one match.created change event per Match, none committed twice
        assert watch.execute("SELECT count(*), count(DISTINCT payload->>'match_id') FROM journal"
                             " WHERE kind = 'match.created' AND payload->>'subscription_id' = %s",
                             (sid,)).fetchone() == (records, records)
        assert set(events) == {m["match_id"] for m in listed}

        # part 2 Events: every request verified; deduplicated by webhook-id, the receiver holds
        # each Match's notice (the same webhook-id on a redone attempt, decisions-part2 "Deliveries")
        with receiver.lock:  # this Subscription's requests (both variants may run on one server)
            received = [r for r in receiver.received if json.loads(r.body)["subscription_id"] == sid]
        assert received and all(r.verified for r in received), [r.error for r in received if not r.verified][:3]
        by_id, bodies = {}, {}
        for r in received:
            body = json.loads(r.body)
            assert body["event_id"] == r.webhook_id and body["type"] == "match.created"
            by_id.setdefault(r.webhook_id, body["match_id"])
            # a redone attempt (after a kill) sends the same bytes under the same webhook-id
            # (decisions-part2 "WebhookEvent and signing": byte-identical across attempts)
            assert bodies.setdefault(r.webhook_id, r.body) == r.body
        assert {events[match_id] for match_id in events} <= set(by_id)
        assert set(by_id.values()) == set(events)
        print(f"\n{records} Records: {len(received)} requests for {len(by_id)} webhook-ids"
              f" ({sum(1 for r in received if r.status == 200)} accepted);"
              f" monitor killed at {monitor.progress_at_kill} Matches,"
              f" deliveries killed at {sender.progress_at_kill} delivered")
    assert "Traceback" not in deployment.server.log_path.read_text(errors="replace")


def test_kill_minus_nine_of_monitor_and_deliveries_loses_and_duplicates_no_match(deployment):
    # design.md "Part 2": plugin calls outside transactions, results committed idempotently;
    # decisions-part2 "Deliveries": a crashed sender's attempt is redone, at least once, same webhook-id
    flood_under_kills(deployment, 200)


@pytest.mark.slow
def test_kill_minus_nine_with_a_thousand_records(deployment):
    # the soak size: 1,000 matching Records (make test-slow)
    flood_under_kills(deployment, 1000)


# ---------------------------------------------------------------- receiver faults


def test_a_refusal_then_acceptance_succeeds_on_the_second_attempt(api, deployment):
    # decisions-part2 "Deliveries": a non-2xx is a failed attempt (http_status), attempt 2 is due
    # retry_schedule[1] after it; 2xx -> succeeded, last_error cleared
    receiver = deployment.receivers["flaky"]
    receiver.answer_next(Answer(status=500, body=b"busy"))
    _, delivery_id = matched_delivery(api, "flaky")
    d = wait_delivery(api, delivery_id, lambda d: d["state"] != "pending", "the Delivery to settle")
    assert d["state"] == "succeeded" and d["attempts"] == 2 and "last_error" not in d, d
    first, second = attempts(api, delivery_id)
    assert (first["status_code"], first["error_code"], first["response_excerpt"]) == (500, "http_status", "busy")
    assert second["status_code"] == 200 and "error_code" not in second
    sent = receiver.requests_for(d["event_id"])
    assert [r.status for r in sent] == [500, 200] and all(r.verified for r in sent)
    assert sent[0].body == sent[1].body  # decisions-part2 "WebhookEvent and signing": byte-identical


def test_a_receiver_hanging_past_the_attempt_timeout_times_out_then_succeeds(api, deployment):
    # decisions-part2 "Deliveries": the whole attempt is bounded by attempt_timeout_seconds; the
    # attempt is recorded with error_code timeout (no status), and the next one succeeds
    receiver = deployment.receivers["hanging"]
    receiver.answer_next(Answer(delay_seconds=ATTEMPT_TIMEOUT_S + 3))
    _, delivery_id = matched_delivery(api, "hanging")
    d = wait_delivery(api, delivery_id, lambda d: d["state"] != "pending", "the Delivery to settle")
    assert d["state"] == "succeeded" and d["attempts"] == 2, d
    first, second = attempts(api, delivery_id)
    assert first["error_code"] == "timeout" and "status_code" not in first, first
    assert first["duration_ms"] >= ATTEMPT_TIMEOUT_S * 1000 - 10 and first["response_excerpt"] == ""
    assert second["status_code"] == 200 and "error_code" not in second
    sent = receiver.requests_for(d["event_id"])
    assert len(sent) == 2 and all(r.verified for r in sent)


def test_a_410_fails_the_delivery_destination_gone_at_once(api, deployment):
    # decisions-part2 "Deliveries": 410 -> failed destination_gone at once, no further attempt;
    # last_error keeps the attempt's status_code
    receiver = deployment.receivers["gone"]
    receiver.answer_next(Answer(status=410, body=b"gone"))
    _, delivery_id = matched_delivery(api, "gone")
    d = wait_delivery(api, delivery_id, lambda d: d["state"] != "pending", "the Delivery to settle")
    assert d["state"] == "failed" and d["attempts"] == 1 and "failed_at" in d and "next_attempt_at" not in d, d
    assert d["last_error"]["code"] == "destination_gone" and d["last_error"]["status_code"] == 410, d
    [only] = attempts(api, delivery_id)
    assert only["status_code"] == 410 and only["error_code"] == "http_status"
    time.sleep(1.5)  # the schedule's next attempt would have come 1 s later
    assert len(receiver.requests_for(d["event_id"])) == 1


def test_retry_after_delays_the_next_attempt(api, deployment):
    # decisions-part2 "Deliveries": a Retry-After on a non-2xx raises the next delay to it (the
    # schedule alone says 1 s, jitter 0)
    receiver = deployment.receivers["later"]
    receiver.answer_next(Answer(status=503, headers={"Retry-After": str(RETRY_AFTER_S)}))
    _, delivery_id = matched_delivery(api, "later")
    d = wait_delivery(api, delivery_id, lambda d: d["state"] != "pending", "the Delivery to settle")
    assert d["state"] == "succeeded" and d["attempts"] == 2, d
    first, second = attempts(api, delivery_id)
    assert first["status_code"] == 503
    # not before it: the timestamps are kept to the millisecond
    assert (at(second["started_at"]) - at(first["finished_at"])).total_seconds() >= RETRY_AFTER_S - 0.002, \
        (first, second)
    sent = receiver.requests_for(d["event_id"])
    assert len(sent) == 2 and sent[1].arrived - sent[0].arrived >= RETRY_AFTER_S


# ---------------------------------------------------------------- disable, enable, delete


def test_disable_holds_a_real_match_delivery_and_enable_delivers_it(api, deployment):
    # part 2 "Subscription" states; decisions-part2 "Deliveries": disable sets held
    # subscription_disabled on every pending Delivery (parked: no next_attempt_at); enable clears it
    # and the Delivery is due at once
    receiver = deployment.receivers["paused"]
    receiver.default = Answer(status=503, headers={"Retry-After": "60"}, body=b"not now")
    corpus = create_corpus(api)
    sub = subscribe(api, corpus, "paused")
    sid = sub["subscription_id"]
    record = ingest(api, corpus, "one", "A crane waits.")
    delivery_id = delivery_id_of(match_of(api, sid, record["record_id"]))
    d = wait_delivery(api, delivery_id, lambda d: d["attempts"] >= 1, "the first refused attempt")
    assert d["state"] == "pending" and d["last_error"]["status_code"] == 503 and "next_attempt_at" in d, d

    r = api.post(f"/v0/subscriptions/{sid}/disable", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 200 and r.json()["enabled"] is False, r.text
    d = delivery(api, delivery_id)
    assert d["state"] == "pending" and d["held"] == "subscription_disabled" and "next_attempt_at" not in d, d
    # What an operator sees: the held Delivery waits for no worker (`contentsvc worker status`).
    waiting = worker_status_rows(deployment.url)["deliveries"]["waiting"]
    assert waiting.endswith(", 1 held"), waiting

    receiver.default = Answer(status=200)
    r = api.post(f"/v0/subscriptions/{sid}/enable", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 200 and r.json()["enabled"] is True, r.text
    # due at once, not at the Retry-After's 60 s: the wait is well under it
    d = wait_delivery(api, delivery_id, lambda d: d["state"] != "pending", "the Delivery after enable", timeout=30)
    assert d["state"] == "succeeded" and d["attempts"] == 2 and "held" not in d and "last_error" not in d, d
    first, second = attempts(api, delivery_id)
    assert (first["status_code"], first["error_code"]) == (503, "http_status")
    assert second["status_code"] == 200
    sent = receiver.requests_for(d["event_id"])
    assert [r.status for r in sent] == [503, 200] and all(r.verified for r in sent)


def test_a_withdrawal_after_delete_gives_a_never_attempted_notice(api, deployment):
    # part 2 "Subscription" states: after delete, a match.withdrawn notice is still committed with
    # its pending Delivery but never attempted; decisions-part2 "Deliveries": held
    # subscription_deleted (never cleared); decisions-part2 "Matches": withdrawn at record.withdrawn
    # whatever the Subscription's state
    receiver = deployment.receivers["deleted"]
    corpus = create_corpus(api)
    sub = subscribe(api, corpus, "deleted")
    sid = sub["subscription_id"]
    record = ingest(api, corpus, "one", "A crane, soon gone.")
    match = match_of(api, sid, record["record_id"])
    created = wait_delivery(api, delivery_id_of(match), lambda d: d["state"] == "succeeded",
                            "the match.created Delivery")
    r = api.post(f"/v0/subscriptions/{sid}/delete", json={"idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 200 and r.json()["deleted"] is True, r.text

    r = api.post("/v0/records/withdrawals", json={"idempotency_key": uuid.uuid4().hex, "source": {
        "corpus_id": corpus, "namespace": "test", "record_key": "one"}})
    assert r.status_code == 202, r.text

    def withdrawn():
        m = api.get(f"/v0/matches/{match['match_id']}")
        assert m.status_code == 200, m.text  # a deleted Subscription's Matches stay readable
        m = m.json()
        return m if m["state"] == "withdrawn" and len(m["deliveries"]) == 2 else None
    now = until(withdrawn, "the match.withdrawn notice")
    assert now["withdrawn_reason"] == "record_withdrawn"
    notice_id = delivery_id_of(now, "match.withdrawn")
    d = delivery(api, notice_id)
    assert d["state"] == "pending" and d["held"] == "subscription_deleted" and d["attempts"] == 0, d
    assert "next_attempt_at" not in d
    time.sleep(1.5)  # the worker polls at least every second: a due one would have been sent by now
    d = delivery(api, notice_id)
    assert d["state"] == "pending" and d["held"] == "subscription_deleted" and d["attempts"] == 0, d
    assert attempts(api, notice_id) == []
    assert receiver.requests_for(d["event_id"]) == []
    assert [r.webhook_id for r in receiver.received] == [created["event_id"]]
