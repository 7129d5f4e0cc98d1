"""The `deliveries` worker against a real database and a real receiver that verifies every
request with the Standard Webhooks reference implementation (decisions-part2, "Deliveries",
"WebhookEvent and signing"; part2 Events: notification webhook, at least once).

Deliveries are created through the store (monitoring/deliveries.py) as the evaluator will create
them; the worker runs in-process through the projector runner, or as `contentsvc worker run
deliveries` processes for the crash test. Schedules are short; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path

import psycopg
import pytest
from psycopg import AsyncConnection

from contentsvc.config.settings import DeliverySettings, DestinationSettings, Settings
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.monitoring import deliveries as store
from contentsvc.monitoring.deliverer import DeliveriesWorker
from contentsvc.projectors import runner
from tests.integration.webhook_receiver import Answer, WebhookReceiver

SECRET = "whsec_" + base64.b64encode(b"delivery-test-secret-bytes-0123").decode()
FAST = dict(retry_schedule=[0, 1, 1, 1], jitter=0.0, attempt_timeout_seconds=2, window_seconds=3600,
            max_retry_after_seconds=3600, concurrency=4)


@pytest.fixture(scope="module")
def database_url(databases):
    """The module's own database: the session's server runs a deliveries worker of its own, whose
    startup file names other destinations, and must not claim these Deliveries."""
    return databases.create()


@pytest.fixture
def receiver():
    r = WebhookReceiver(SECRET)
    yield r
    r.stop()


def settings_for(url: str, receiver: WebhookReceiver, destinations: tuple[str, ...] = ("recv",), **deliveries) -> Settings:
    return Settings(database_url=url, deliveries=DeliverySettings(**{**FAST, **deliveries}),
                    destinations={d: DestinationSettings(url=receiver.url, secret=SECRET) for d in destinations})


def notice(event_type="match.created", destination="recv", subscription_id=None, owner=None) -> store.Notice:
    tag = uuid.uuid4().hex[:10]
    return store.Notice(org_id="org-dlv", corpus_id=f"corpus-{tag}", match_id=f"mat_{tag}",
                        subscription_id=subscription_id or f"sub_{tag}", subscription_version_id=f"subv_{tag}",
                        saved_query_id=f"sq_{tag}", saved_query_version_id=f"sqv_{tag}", record_id=f"rec_{tag}",
                        version_id=f"ver_{tag}", destination_id=destination, event_type=event_type, owner=owner)


async def create(url: str, settings: Settings, n: store.Notice, held: str | None = None) -> store.Delivery:
    async with await AsyncConnection.connect(url) as conn:
        async with journal_transaction(conn):
            return await store.create_delivery(conn, n, settings.deliveries, held)


async def in_transaction(url: str, work):
    """Runs `work(conn)` (a hold or release) in a journal transaction and appends its events."""
    from contentsvc.journal.store import append

    async with await AsyncConnection.connect(url) as conn:
        async with journal_transaction(conn):
            await append(conn, await work(conn))


def delivery(url: str, delivery_id: str) -> dict:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT state, held, attempts, next_attempt_at, last_attempt_at, last_error,"
                           " window_ends_at, body, event_id FROM deliveries WHERE delivery_id = %s",
                           (delivery_id,)).fetchone()
    keys = ("state", "held", "attempts", "next_attempt_at", "last_attempt_at", "last_error", "window_ends_at",
            "body", "event_id")
    return dict(zip(keys, row))


def attempts(url: str, delivery_id: str) -> list[dict]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT number, started_at, finished_at, status_code, error_code, response_excerpt"
                            " FROM delivery_attempts WHERE delivery_id = %s ORDER BY number", (delivery_id,)).fetchall()
    return [dict(zip(("number", "started_at", "finished_at", "status_code", "error_code", "excerpt"), r)) for r in rows]


def changes(url: str, delivery_id: str) -> list[tuple[str, dict]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT corpus_id, payload FROM journal WHERE kind = 'delivery.changed' AND subject_id = %s"
                            " AND subject_type = 'delivery' AND public ORDER BY position", (delivery_id,)).fetchall()
    return rows


async def run_workers(url: str, settings: Settings, until, count: int = 1, timeout: float = 20.0) -> None:
    """Runs `count` workers until `until()` holds (checked every 50 ms), at most `timeout` seconds."""
    stop = asyncio.Event()
    workers = [DeliveriesWorker.from_settings(settings) for _ in range(count)]
    tasks = [asyncio.create_task(runner.run(url, w, poll_seconds=0.2, stop=stop)) for w in workers]
    try:
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(until):
            for task in tasks:
                if task.done():
                    task.result()  # a crashed worker fails the test with its error
            assert time.monotonic() < deadline, "condition not reached in time"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
        for w in workers:
            await w.close()


def settled(url: str, delivery_id: str):
    return lambda: delivery(url, delivery_id)["state"] != "pending"


def test_a_notice_is_sent_signed_and_verified_and_succeeds(database_url, receiver):
    # decisions-part2 "WebhookEvent and signing"; "Deliveries": 2xx -> succeeded; delivery.changed in the Match's Corpus
    settings = settings_for(database_url, receiver)
    n = notice(owner="user-1")
    d = asyncio.run(create(database_url, settings, n))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    row = delivery(database_url, d.delivery_id)
    assert row["state"] == "succeeded" and row["attempts"] == 1 and row["held"] is None
    [got] = receiver.requests_for(d.event_id)
    assert got.verified, got.error
    assert got.body == bytes(row["body"]) and got.webhook_id == d.event_id and d.event_id.startswith("wev_")
    assert got.headers["user-agent"].startswith("contentsvc-webhooks/")
    # decisions-part2 "Deliveries" names every header; HTTP/1.1 adds Host and the body's length.
    assert set(got.headers) == {"host", "content-length", "content-type", "user-agent", "webhook-id",
                                "webhook-timestamp", "webhook-signature"}
    assert got.headers["host"] == receiver.url.split("/")[2] and got.headers["content-type"] == "application/json"
    [attempt] = attempts(database_url, d.delivery_id)
    assert attempt["status_code"] == 200 and attempt["error_code"] is None and attempt["excerpt"] == "ok"
    [(corpus, payload)] = changes(database_url, d.delivery_id)
    assert corpus == n.corpus_id and payload["state"] == "succeeded"


def test_connection_refused_is_retried_on_the_schedule_until_the_receiver_is_back(database_url, receiver):
    # decisions-part2 "Deliveries": attempt n is due retry_schedule[n-1] after the previous attempt finished
    settings = settings_for(database_url, receiver, retry_schedule=[0, 1, 2, 1, 1])
    receiver.stop()
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, lambda: len(attempts(database_url, d.delivery_id)) >= 2))
    receiver.start()  # same port
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    made = attempts(database_url, d.delivery_id)
    assert [a["error_code"] for a in made[:2]] == ["connect_error", "connect_error"]
    assert made[-1]["status_code"] == 200 and delivery(database_url, d.delivery_id)["state"] == "succeeded"
    for previous, following in zip(made, made[1:]):
        delay = settings.deliveries.retry_schedule[previous["number"]]
        assert following["started_at"] - previous["finished_at"] >= timedelta(seconds=delay)
    assert all(r.verified for r in receiver.requests_for(d.event_id))


def test_410_fails_the_delivery_destination_gone_at_once(database_url, receiver):
    # decisions-part2 "Deliveries": 410 -> failed destination_gone at once
    settings = settings_for(database_url, receiver)
    receiver.answer_next(Answer(status=410, body=b"gone"))
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    row = delivery(database_url, d.delivery_id)
    assert row["state"] == "failed" and row["last_error"]["code"] == "destination_gone"
    assert row["last_error"]["status_code"] == 410 and row["attempts"] == 1
    assert [a["excerpt"] for a in attempts(database_url, d.delivery_id)] == ["gone"]


def test_a_redirect_is_a_failed_attempt_and_never_followed(database_url, receiver):
    # decisions-part2 "Deliveries": redirects are not followed (3xx is a failed attempt)
    settings = settings_for(database_url, receiver)
    receiver.answer_next(Answer(status=301, headers={"location": receiver.url + "/moved"}))
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    made = attempts(database_url, d.delivery_id)
    assert (made[0]["status_code"], made[0]["error_code"]) == (301, "http_status")
    assert made[1]["status_code"] == 200 and len(receiver.requests_for(d.event_id)) == 2


def test_attempts_exhausted_after_the_last_scheduled_attempt(database_url, receiver):
    # decisions-part2 "Deliveries": after the last scheduled attempt -> failed attempts_exhausted
    settings = settings_for(database_url, receiver, retry_schedule=[0, 0, 0])
    receiver.answer_next(*[Answer(status=500, body="é".encode() * 400)] * 3)
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    row = delivery(database_url, d.delivery_id)
    assert row["state"] == "failed" and row["last_error"]["code"] == "attempts_exhausted" and row["attempts"] == 3
    made = attempts(database_url, d.delivery_id)
    assert [a["number"] for a in made] == [1, 2, 3]
    # response_excerpt: the first 512 bytes, UTF-8 with replacement (256 two-byte characters)
    assert made[0]["excerpt"] == "é" * 256


def test_retry_after_in_seconds_and_as_an_http_date_raises_the_next_delay(database_url, receiver):
    # decisions-part2 "Deliveries": Retry-After (seconds or HTTP date) raises the next delay,
    # capped at max_retry_after_seconds
    settings = settings_for(database_url, receiver, retry_schedule=[0, 0, 0], max_retry_after_seconds=2)
    far = format_datetime(datetime.now(timezone.utc) + timedelta(hours=1), usegmt=True)
    receiver.answer_next(Answer(status=503, headers={"retry-after": "1"}), Answer(status=503, headers={"retry-after": far}))
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    made = attempts(database_url, d.delivery_id)
    assert [a["status_code"] for a in made] == [503, 503, 200]
    assert made[1]["started_at"] - made[0]["finished_at"] >= timedelta(seconds=1)
    assert made[2]["started_at"] - made[1]["finished_at"] >= timedelta(seconds=2)  # the cap, not an hour


def test_disable_parks_and_enable_makes_due_at_once(database_url, receiver):
    # decisions-part2 "Deliveries": held is never attempted; enable clears subscription_disabled, due at once;
    # each held change commits delivery.changed
    settings = settings_for(database_url, receiver)
    sub = f"sub_{uuid.uuid4().hex[:10]}"
    d = asyncio.run(create(database_url, settings, notice(subscription_id=sub)))
    asyncio.run(in_transaction(database_url, lambda c: store.hold_subscription(c, sub, store.HELD_DISABLED)))
    row = delivery(database_url, d.delivery_id)
    assert row["held"] == "subscription_disabled" and row["next_attempt_at"] is None
    started = time.monotonic()
    asyncio.run(run_workers(database_url, settings, lambda: time.monotonic() - started > 1.0))
    assert receiver.requests_for(d.event_id) == [] and delivery(database_url, d.delivery_id)["attempts"] == 0
    asyncio.run(in_transaction(database_url, lambda c: store.release_subscription(c, sub, settings.deliveries)))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    assert delivery(database_url, d.delivery_id)["state"] == "succeeded"
    assert [(p["state"], p["held"]) for _, p in changes(database_url, d.delivery_id)] == [
        ("pending", "subscription_disabled"), ("pending", None), ("succeeded", None)]


def test_a_withdrawn_notice_of_a_disabled_subscription_gets_its_window_at_enable(database_url, receiver):
    # part2 Subscription: a match.withdrawn notice committed while disabled has its window start at re-enable
    settings = settings_for(database_url, receiver, window_seconds=60)
    sub = f"sub_{uuid.uuid4().hex[:10]}"
    d = asyncio.run(create(database_url, settings, notice("match.withdrawn", subscription_id=sub),
                           held=store.HELD_DISABLED))
    assert d.held == "subscription_disabled" and d.window_ends_at is store.UNSET
    time.sleep(1.1)
    asyncio.run(in_transaction(database_url, lambda c: store.release_subscription(c, sub, settings.deliveries)))
    row = delivery(database_url, d.delivery_id)
    created = datetime.fromisoformat(d.created_at.replace("Z", "+00:00"))
    assert row["state"] == "pending" and row["window_ends_at"] > created + timedelta(seconds=61)
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    assert delivery(database_url, d.delivery_id)["state"] == "succeeded"


def test_a_window_passed_while_disabled_fails_at_enable_without_an_attempt(database_url, receiver):
    # decisions-part2 "Deliveries": enable -> a Delivery whose window_ends_at has passed fails
    # delivery_window_expired without an attempt
    settings = settings_for(database_url, receiver, window_seconds=1)
    sub = f"sub_{uuid.uuid4().hex[:10]}"
    d = asyncio.run(create(database_url, settings, notice(subscription_id=sub), held=store.HELD_DISABLED))
    time.sleep(1.1)
    asyncio.run(in_transaction(database_url, lambda c: store.release_subscription(c, sub, settings.deliveries)))
    row = delivery(database_url, d.delivery_id)
    assert row["state"] == "failed" and row["last_error"]["code"] == "delivery_window_expired" and row["attempts"] == 0
    assert receiver.requests_for(d.event_id) == []


def test_a_delivery_due_past_its_window_fails_without_an_attempt(database_url, receiver):
    # decisions-part2 "Deliveries": attempts are admitted only before window_ends_at; a due Delivery past it fails
    settings = settings_for(database_url, receiver, retry_schedule=[0, 2], window_seconds=1)
    receiver.answer_next(Answer(status=500))
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    row = delivery(database_url, d.delivery_id)
    assert row["state"] == "failed" and row["last_error"]["code"] == "delivery_window_expired" and row["attempts"] == 1
    assert len(receiver.requests_for(d.event_id)) == 1


def test_delete_holds_for_good_and_a_missing_destination_holds_until_it_returns(database_url, receiver):
    # decisions-part2 "Deliveries": delete sets subscription_deleted (never cleared);
    # "Destinations": a destination dropped from the file holds destination_unconfigured until it returns
    settings = settings_for(database_url, receiver)
    sub = f"sub_{uuid.uuid4().hex[:10]}"
    deleted = asyncio.run(create(database_url, settings, notice(subscription_id=sub)))
    asyncio.run(in_transaction(database_url, lambda c: store.hold_subscription(c, sub, store.HELD_DELETED)))
    asyncio.run(in_transaction(database_url, lambda c: store.release_subscription(c, sub, settings.deliveries)))
    elsewhere = asyncio.run(create(database_url, settings, notice(destination="elsewhere")))
    asyncio.run(run_workers(database_url, settings,
                            lambda: delivery(database_url, elsewhere.delivery_id)["held"] is not None))
    assert delivery(database_url, elsewhere.delivery_id)["held"] == "destination_unconfigured"
    assert delivery(database_url, deleted.delivery_id)["held"] == "subscription_deleted"
    # the destination is back in the startup file: due at once
    back = settings_for(database_url, receiver, destinations=("recv", "elsewhere"))
    asyncio.run(run_workers(database_url, back, settled(database_url, elsewhere.delivery_id)))
    assert delivery(database_url, elsewhere.delivery_id)["state"] == "succeeded"
    assert delivery(database_url, deleted.delivery_id)["state"] == "pending"
    assert receiver.requests_for(deleted.event_id) == []


def test_two_workers_never_send_the_same_delivery_at_the_same_time(database_url, receiver):
    # design.md "Part 2": due work is leased with SELECT ... FOR UPDATE SKIP LOCKED and a lease expiry;
    # decisions-part2 "Deliveries": claimed with a row lock and a lease
    settings = settings_for(database_url, receiver, concurrency=3)
    receiver.default = Answer(delay_seconds=0.2)
    made = [asyncio.run(create(database_url, settings, notice())) for _ in range(24)]
    ids = [d.delivery_id for d in made]

    def all_settled() -> bool:
        with psycopg.connect(database_url) as conn:
            return conn.execute("SELECT count(*) FROM deliveries WHERE delivery_id = ANY(%s) AND state = 'pending'",
                                (ids,)).fetchone()[0] == 0

    asyncio.run(run_workers(database_url, settings, all_settled, count=2, timeout=30))
    for d in made:
        assert receiver.max_in_flight[d.event_id] == 1
        assert len(receiver.requests_for(d.event_id)) == 1  # no lease expired: each sent exactly once
        assert delivery(database_url, d.delivery_id)["state"] == "succeeded"


def _worker_process(url: str, receiver: WebhookReceiver, home: Path, log_path: Path) -> subprocess.Popen:
    config = home / "contentsvc.toml"
    config.write_text(f"""
database_url = "{url}"
home = "{home}"
[deliveries]
retry_schedule = [0, 1]
jitter = 0.0
attempt_timeout_seconds = 1
[destinations.recv]
url = "{receiver.url}"
secret = "{SECRET}"
""")
    env = {**os.environ, "CONTENTSVC_CONFIG": str(config)}
    return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", "worker", "run", "deliveries"], env=env,
                            stdout=log_path.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)


def test_a_worker_killed_mid_attempt_is_redone_with_the_same_webhook_id(database_url, receiver, tmp_path):
    # decisions-part2 "Deliveries": a crashed sender's attempt is redone (at least once), with the same webhook-id;
    # design.md: a crash between the call and the commit repeats the call, never loses or doubles the outcome
    settings = settings_for(database_url, receiver, retry_schedule=[0, 1], attempt_timeout_seconds=1)
    receiver.answer_next(Answer(delay_seconds=30))  # holds the first request until the sender is gone
    d = asyncio.run(create(database_url, settings, notice()))
    log_path = tmp_path / "worker.log"
    first = _worker_process(database_url, receiver, tmp_path, log_path)
    try:
        deadline = time.monotonic() + 20
        while not receiver.requests_for(d.event_id):
            assert first.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        os.kill(first.pid, signal.SIGKILL)  # mid-attempt: sent, no answer yet, nothing recorded
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
    assert attempts(database_url, d.delivery_id) == []
    second = _worker_process(database_url, receiver, tmp_path, log_path)
    try:
        deadline = time.monotonic() + 30  # the lease (timeout 1 s + 5 s) must expire first
        while delivery(database_url, d.delivery_id)["state"] == "pending":
            assert second.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(second.pid, signal.SIGKILL)
            second.wait(timeout=10)
    got = receiver.requests_for(d.event_id)
    assert len(got) == 2 and all(r.verified for r in got)
    assert got[0].body == got[1].body  # byte-identical across attempts
    made = attempts(database_url, d.delivery_id)
    assert [(a["number"], a["status_code"]) for a in made] == [(1, 200)]  # the outcome recorded once
    assert delivery(database_url, d.delivery_id)["state"] == "succeeded"
    log = log_path.read_text()
    assert SECRET not in log and "v1," not in log  # never a secret or a signature in the log


async def _claim_and_send(url: str, settings: Settings, count: int):
    """The worker's claim and sends for `count` due Deliveries, not yet recorded: (worker, claims, ended)."""
    worker = DeliveriesWorker.from_settings(settings)
    async with await AsyncConnection.connect(url) as conn:
        claims = await store.claim_due(conn, settings.deliveries, worker.configured, count)
    ended = [(claim, await worker.send(claim)) for claim in claims]
    return worker, claims, ended


def test_a_batch_records_every_outcome_in_one_transaction_and_drops_only_a_lost_lease(databases, receiver):
    # decisions-part2 "Deliveries": each state change commits delivery.changed; claimed with a lease (a late
    # outcome whose lease another worker took over is dropped); docs/decisions.md "Deliveries and the deliveries worker"
    url = databases.create()  # its own database: the claim must see only these Deliveries
    settings = settings_for(url, receiver)
    made = [asyncio.run(create(url, settings, notice())) for _ in range(3)]

    async def scenario():
        worker, claims, ended = await _claim_and_send(url, settings, 3)
        assert len(claims) == 3
        lost = claims[1]
        async with await AsyncConnection.connect(url, autocommit=True) as conn:  # another worker's takeover
            await conn.execute("UPDATE deliveries SET lease_token = 'other' WHERE delivery_id = %s", (lost.delivery_id,))
            before = (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]
            states = await store.record_attempts(conn, ended, settings.deliveries)
            positions = await (await conn.execute(
                "SELECT DISTINCT xmin::text FROM journal WHERE position > %s", (before,))).fetchall()
        await worker.close()
        return lost, states, positions

    lost, states, positions = asyncio.run(scenario())
    assert states.count(None) == 1 and states.count("succeeded") == 2
    assert len(positions) == 1  # the two delivery.changed were committed by one transaction
    for d in made:
        if d.delivery_id == lost.delivery_id:
            assert delivery(url, d.delivery_id)["state"] == "pending" and attempts(url, d.delivery_id) == []
            assert changes(url, d.delivery_id) == []
        else:
            assert delivery(url, d.delivery_id)["state"] == "succeeded" and len(attempts(url, d.delivery_id)) == 1
            assert len(changes(url, d.delivery_id)) == 1


def test_an_outcome_that_cannot_be_recorded_costs_only_itself(databases, receiver):
    # docs/decisions.md "Deliveries and the deliveries worker": a batch that raises is recorded one by one;
    # the unrecordable outcome keeps its lease, which expires (the attempt is redone, at least once)
    url = databases.create()
    settings = settings_for(url, receiver)
    made = [asyncio.run(create(url, settings, notice())) for _ in range(3)]

    async def scenario():
        worker, claims, ended = await _claim_and_send(url, settings, 3)
        bad_claim, bad_outcome = ended[0]
        # An error code the attempts table refuses (its CHECK): the batch's transaction raises.
        ended[0] = (bad_claim, dataclasses.replace(bad_outcome, status_code=None, error_code="not_a_code"))
        async with await AsyncConnection.connect(url) as conn:
            await worker.record(conn, ended, 0)
        await worker.close()
        return bad_claim

    bad = asyncio.run(scenario())
    for d in made:
        row = delivery(url, d.delivery_id)
        if d.delivery_id == bad.delivery_id:
            assert row["state"] == "pending" and attempts(url, d.delivery_id) == []
        else:
            assert row["state"] == "succeeded" and len(attempts(url, d.delivery_id)) == 1
            assert len(changes(url, d.delivery_id)) == 1
    with psycopg.connect(url) as conn:
        token = conn.execute("SELECT lease_token FROM deliveries WHERE delivery_id = %s",
                             (bad.delivery_id,)).fetchone()[0]
    assert token == bad.lease_token


def test_a_nul_in_the_answer_is_recorded_as_a_replacement_character(database_url, receiver):
    # decisions-part2 "Deliveries": response_excerpt = first 512 bytes decoded as UTF-8 with replacement;
    # docs/decisions.md: a NUL (which a PostgreSQL text cannot hold) becomes U+FFFD
    settings = settings_for(database_url, receiver)
    receiver.default = Answer(body=b"ok\x00done")
    d = asyncio.run(create(database_url, settings, notice()))
    asyncio.run(run_workers(database_url, settings, settled(database_url, d.delivery_id)))
    assert delivery(database_url, d.delivery_id)["state"] == "succeeded"
    assert attempts(database_url, d.delivery_id)[0]["excerpt"] == "ok\ufffddone"
