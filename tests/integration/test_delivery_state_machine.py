"""The Delivery state machine under any interleaving (part 2 Events: notification webhook;
decisions-part2 "Monitoring" > "Deliveries"; docs/decisions.md "Deliveries and the deliveries
worker").

A hypothesis RuleBasedStateMachine drives the real store (monitoring/deliveries.py) against a real
PostgreSQL database of this module's own: notices (match.created / match.withdrawn) for two
Subscriptions, claims and attempt results (2xx, 5xx, 5xx with Retry-After, 410, 3xx, timeout,
connect_error) recorded while other steps interleave, disable, enable and delete (run the way
monitoring/commands.py runs them: the Subscription's row locked FOR UPDATE, the holds moved and the
row changed in one transaction), a destination leaving and returning to the startup file, and time
passing. After every step the contract's invariants are checked against the rows and the journal.

Time: the store takes `now` from the database, so "time passes by s seconds" moves every stored
instant of this machine's Deliveries and Attempts s seconds into the past (created_at,
next_attempt_at, window_ends_at, lease_expires_at, ...), which to the store is the clock moving s
seconds forward. Instants are compared in "virtual time" (a stored instant + the seconds shifted so
far). Schedules, windows and shifts are whole seconds; the few milliseconds of real time a step takes
are allowed for by a one-second band where a due or window check could fall either way.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, \
    run_state_machine_as_test
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.config.settings import DeliverySettings
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.monitoring import deliveries as store

# Bounded so the module runs in seconds; a deeper search: CONTENTSVC_DELIVERY_MACHINE_EXAMPLES=500 (and _STEPS).
EXAMPLES = int(os.environ.get("CONTENTSVC_DELIVERY_MACHINE_EXAMPLES", "25"))
STEPS = int(os.environ.get("CONTENTSVC_DELIVERY_MACHINE_STEPS", "20"))
ORG = "org-dsm"
SCHEDULE = [0, 5, 20]  # three attempts; attempt 2 due 5 s after attempt 1 finished, attempt 3 20 s after
DELIVERY = DeliverySettings(retry_schedule=SCHEDULE, jitter=0.0, attempt_timeout_seconds=2, window_seconds=60,
                            max_retry_after_seconds=30, concurrency=4)
LEASE = DELIVERY.attempt_timeout_seconds + store.LEASE_MARGIN_SECONDS
ALWAYS, SOMETIMES = "dest-always", "dest-sometimes"  # the second one leaves and returns to the startup file
TERMINAL_CODES = {store.DESTINATION_GONE, store.ATTEMPTS_EXHAUSTED, store.WINDOW_EXPIRED}
ATTEMPT_CODES = {"timeout", "connect_error", "tls_error", "http_status", "invalid_response"}
BAND = timedelta(seconds=1)  # real time a few steps may take; due and window checks near it may go either way

# What a receiver may answer (the worker turns an answer into an Outcome as deliverer.py does).
RESULTS = {
    "2xx": (200, None, None),
    "5xx": (500, "http_status", None),
    "5xx_retry_after": (503, "http_status", "10"),
    "5xx_retry_after_over_cap": (503, "http_status", "3600"),
    "410": (410, "http_status", None),
    "3xx": (301, "http_status", None),
    "timeout": (None, "timeout", None),
    "connect_error": (None, "connect_error", None),
}


@pytest.fixture(scope="module")
def machine_database(databases):
    """The module's own database: a server's deliveries worker on the shared one would claim these."""
    return databases.create()


def _retrying(connect):
    """The shared test server may briefly refuse with "too many clients": try again, bounded."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return connect()
        except psycopg.OperationalError as exc:
            if "too many clients" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _plus(value: datetime | None, seconds: float) -> datetime | None:
    return None if value is None else value + timedelta(seconds=seconds)


class DeliveryMachine(RuleBasedStateMachine):
    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.conn: AsyncConnection = _retrying(lambda: self.loop.run_until_complete(AsyncConnection.connect(self.url)))
        self.db = _retrying(lambda: psycopg.connect(self.url, autocommit=True, row_factory=dict_row))
        # Each example starts from no Deliveries at all: claim_due and the destination release read them all.
        self.db.execute("DELETE FROM delivery_attempts")
        self.db.execute("DELETE FROM deliveries")
        tag = uuid.uuid4().hex[:8]
        self.subscriptions = [f"sub_{tag}_a", f"sub_{tag}_b"]
        self.enabled = {s: True for s in self.subscriptions}
        self.deleted = {s: False for s in self.subscriptions}
        self.configured = {ALWAYS, SOMETIMES}
        self.matches: list[tuple[str, str, str, str]] = []  # (match_id, subscription_id, corpus_id, destination)
        self.kinds: dict[tuple[str, str], str] = {}  # (match_id, event_type) -> delivery_id
        self.known: dict[str, dict] = {}  # delivery_id -> what the machine remembers of it
        self.in_flight: list[tuple[store.Claim, datetime]] = []  # claims and their start, in virtual time
        self.elapsed = 0.0  # seconds the clock moved (stored instants shifted back)
        for s in self.subscriptions:
            self.db.execute(
                """INSERT INTO subscriptions (subscription_id, org_id, revision, name, saved_query_id,
                       current_version_id, enabled, deleted, scope, created_at, updated_at)
                   VALUES (%s, %s, 1, %s, %s, %s, true, false, %s, now(), now())""",
                (s, ORG, s, f"sq_{s}", f"subv_{s}", [f"corpus_{s}"]))

    def teardown(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()
        self.db.close()

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    # --------------------------------------------------------------- reading

    def now(self) -> datetime:
        return self.db.execute("SELECT now() AS now").fetchone()["now"]

    def rows(self) -> dict[str, dict]:
        cur = self.db.execute("SELECT * FROM deliveries WHERE org_id = %s ORDER BY delivery_id", (ORG,))
        return {r["delivery_id"]: r for r in cur.fetchall()}

    def row(self, delivery_id: str) -> dict:
        return self.db.execute("SELECT * FROM deliveries WHERE delivery_id = %s", (delivery_id,)).fetchone()

    def attempt_rows(self, delivery_id: str) -> list[dict]:
        return self.db.execute("SELECT * FROM delivery_attempts WHERE delivery_id = %s ORDER BY number",
                               (delivery_id,)).fetchall()

    def events(self, delivery_id: str) -> list[dict]:
        return self.db.execute(
            "SELECT org_id, corpus_id, public, subject_type, payload FROM journal"
            " WHERE kind = 'delivery.changed' AND subject_id = %s ORDER BY position", (delivery_id,)).fetchall()

    def snapshot(self, r: dict) -> tuple:
        """A terminal Delivery as it must stay: every member, instants in virtual time."""
        return (r["state"], r["held"], r["attempts"], r["last_error"], r["next_attempt_at"],
                _plus(r["last_attempt_at"], self.elapsed), _plus(r["succeeded_at"], self.elapsed),
                _plus(r["failed_at"], self.elapsed), _plus(r["window_ends_at"], self.elapsed),
                len(self.attempt_rows(r["delivery_id"])))

    # --------------------------------------------------------------- notices

    async def _notice(self, match_id: str, subscription_id: str, corpus_id: str, destination: str,
                      event_type: str) -> tuple[store.Delivery, str | None]:
        # docs/decisions.md "Hold ordering": the notice's creator reads the hold with notice_hold in its
        # own transaction and passes it to create_delivery.
        async with journal_transaction(self.conn):
            held = await store.notice_hold(self.conn, subscription_id)
            n = store.Notice(org_id=ORG, corpus_id=corpus_id, match_id=match_id, subscription_id=subscription_id,
                             subscription_version_id=f"subv_{subscription_id}", saved_query_id=f"sq_{subscription_id}",
                             saved_query_version_id=f"sqv_{subscription_id}", record_id=f"rec_{match_id}",
                             version_id=f"ver_{match_id}", destination_id=destination, event_type=event_type)
            return await store.create_delivery(self.conn, n, DELIVERY, held), held

    def _expected_notice_hold(self, subscription_id: str) -> str | None:
        if self.deleted[subscription_id]:
            return store.HELD_DELETED
        return None if self.enabled[subscription_id] else store.HELD_DISABLED

    def _remember(self, d: store.Delivery, match_id: str, subscription_id: str, event_type: str,
                  held: str | None) -> None:
        # decisions-part2 "Deliveries": a notice committed for a disabled or deleted Subscription is pending
        # with held set; a match.withdrawn one committed so has no window until re-enable.
        assert d.state == "pending" and d.attempts == 0
        assert (d.held if d.held is not store.UNSET else None) == self._expected_notice_hold(subscription_id) == held
        windowless = held is not None and event_type == store.MATCH_WITHDRAWN
        assert (d.window_ends_at is store.UNSET) == windowless
        self.kinds[(match_id, event_type)] = d.delivery_id
        # docs/decisions.md: creating a Delivery commits no delivery.changed (the Match's event announces it).
        self.known[d.delivery_id] = {"subscription_id": subscription_id, "event_type": event_type,
                                     "windowless_at_creation": windowless, "events": 0,
                                     "last": ("pending", held), "terminal": None, "ever_deleted": False}

    @initialize(destination=st.sampled_from([ALWAYS, SOMETIMES]))
    def a_notice_to_start_with(self, destination):
        self.match_created(0, destination)

    @rule(which=st.integers(0, 1), destination=st.sampled_from([ALWAYS, SOMETIMES]))
    def match_created(self, which, destination):
        subscription_id = self.subscriptions[which]
        match_id = f"mat_{uuid.uuid4().hex[:12]}"
        corpus_id = f"corpus_{subscription_id}_{len(self.matches) % 2}"
        d, held = self.run(self._notice(match_id, subscription_id, corpus_id, destination, store.MATCH_CREATED))
        self.matches.append((match_id, subscription_id, corpus_id, destination))
        self._remember(d, match_id, subscription_id, store.MATCH_CREATED, held)

    @precondition(lambda self: any((m[0], store.MATCH_WITHDRAWN) not in self.kinds for m in self.matches))
    @rule(data=st.data())
    def match_withdrawn(self, data):
        # decisions-part2 "Matches": withdrawal commits match.withdrawn with a pending Delivery whatever the
        # Subscription's state.
        match_id, subscription_id, corpus_id, destination = data.draw(st.sampled_from(
            [m for m in self.matches if (m[0], store.MATCH_WITHDRAWN) not in self.kinds]))
        d, held = self.run(self._notice(match_id, subscription_id, corpus_id, destination, store.MATCH_WITHDRAWN))
        self._remember(d, match_id, subscription_id, store.MATCH_WITHDRAWN, held)

    @precondition(lambda self: self.kinds)
    @rule(data=st.data())
    def notice_again(self, data):
        # decisions-part2 "Deliveries": one Delivery per (Match, event type); a second creation returns the first.
        match_id, event_type = data.draw(st.sampled_from(sorted(self.kinds)))
        _, subscription_id, corpus_id, destination = next(m for m in self.matches if m[0] == match_id)
        before = self.row(self.kinds[(match_id, event_type)])
        d, _ = self.run(self._notice(match_id, subscription_id, corpus_id, destination, event_type))
        assert d.delivery_id == self.kinds[(match_id, event_type)]
        assert self.row(d.delivery_id) == before

    # --------------------------------------------------------------- Subscription commands

    async def _command(self, subscription_id: str, move, enabled: bool, deleted: bool) -> list:
        # docs/decisions.md "Hold ordering", as monitoring/commands.py does it: the row FOR UPDATE, the holds
        # moved, the Subscription changed, the delivery.changed events appended, one transaction.
        async with journal_transaction(self.conn):
            await self.conn.execute("SELECT 1 FROM subscriptions WHERE subscription_id = %s FOR UPDATE",
                                    (subscription_id,))
            events = await move(self.conn)
            await self.conn.execute("UPDATE subscriptions SET enabled = %s, deleted = %s WHERE subscription_id = %s",
                                    (enabled, deleted, subscription_id))
            await append(self.conn, events)
        return events

    def _pending_of(self, subscription_id: str) -> dict[str, dict]:
        return {i: r for i, r in self.rows().items()
                if r["subscription_id"] == subscription_id and r["state"] == "pending"}

    @rule(which=st.integers(0, 1))
    def disable(self, which):
        subscription_id = self.subscriptions[which]
        if self.deleted[subscription_id] or not self.enabled[subscription_id]:
            return  # part 2: disabling a disabled (or deleted) Subscription commits nothing
        before = self._pending_of(subscription_id)
        self.run(self._command(subscription_id, lambda c: store.hold_subscription(c, subscription_id,
                                                                                  store.HELD_DISABLED), False, False))
        self.enabled[subscription_id] = False
        # decisions-part2 "Deliveries": disable sets held subscription_disabled on every pending Delivery.
        for delivery_id, r in before.items():
            after = self.row(delivery_id)
            assert after["state"] == "pending" and after["held"] == store.HELD_DISABLED, after
            assert after["next_attempt_at"] is None and after["attempts"] == r["attempts"]

    @rule(which=st.integers(0, 1))
    def enable(self, which):
        subscription_id = self.subscriptions[which]
        if self.deleted[subscription_id] or self.enabled[subscription_id]:
            return  # part 2: enabling a deleted one is 409, an enabled one commits nothing
        before = self._pending_of(subscription_id)
        now_before = self.now()
        self.run(self._command(subscription_id, lambda c: store.release_subscription(c, subscription_id, DELIVERY),
                               True, False))
        now_after = self.now()
        self.enabled[subscription_id] = True
        # decisions-part2 "Deliveries": enable clears subscription_disabled, each due at once; one whose
        # window_ends_at has passed fails delivery_window_expired without an attempt; a match.withdrawn
        # committed while disabled gets its window now (re-enable + window_seconds).
        for delivery_id, r in before.items():
            assert r["held"] == store.HELD_DISABLED, r
            after = self.row(delivery_id)
            assert after["attempts"] == r["attempts"] and len(self.attempt_rows(delivery_id)) == r["attempts"]
            if r["window_ends_at"] is None:
                assert after["state"] == "pending" and after["held"] is None
                assert now_before + timedelta(seconds=DELIVERY.window_seconds) <= after["window_ends_at"] \
                    <= now_after + timedelta(seconds=DELIVERY.window_seconds)
            elif after["state"] == "failed":
                assert r["window_ends_at"] <= now_after and r["lease_token"] is None
                assert after["last_error"]["code"] == store.WINDOW_EXPIRED and after["held"] is None
            else:
                # still leased (an attempt in flight at the disable): released due, its outcome recorded later
                assert r["window_ends_at"] > now_before - BAND or r["lease_token"] is not None
                assert after["state"] == "pending" and after["held"] is None
                assert after["window_ends_at"] == r["window_ends_at"]
            if after["state"] == "pending":
                assert now_before <= after["next_attempt_at"] <= now_after  # due at once

    @rule(which=st.integers(0, 1))
    def delete(self, which):
        subscription_id = self.subscriptions[which]
        if self.deleted[subscription_id]:
            return  # part 2: a repeated delete commits nothing
        before = self._pending_of(subscription_id)
        self.run(self._command(subscription_id, lambda c: store.hold_subscription(c, subscription_id,
                                                                                  store.HELD_DELETED), False, True))
        self.enabled[subscription_id], self.deleted[subscription_id] = False, True
        # decisions-part2 "Deliveries": delete sets subscription_deleted on every pending Delivery.
        for delivery_id in before:
            after = self.row(delivery_id)
            assert after["state"] == "pending" and after["held"] == store.HELD_DELETED
            assert after["next_attempt_at"] is None

    # --------------------------------------------------------------- the worker's steps

    @rule()
    def claim(self):
        now_before = self.now()
        before = self.rows()
        claims = self.run(store.claim_due(self.conn, DELIVERY, set(self.configured), limit=100))
        now_after = self.now()
        claimed = {c.delivery_id: c for c in claims}
        for delivery_id, r in before.items():
            waiting = r["state"] == "pending" and r["held"] is None and r["next_attempt_at"] is not None
            due = waiting and r["next_attempt_at"] <= now_before and (
                r["lease_expires_at"] is None or r["lease_expires_at"] <= now_before)
            maybe_due = waiting and r["next_attempt_at"] <= now_after and (
                r["lease_expires_at"] is None or r["lease_expires_at"] <= now_after)
            after = self.row(delivery_id)
            if delivery_id in claimed:
                # decisions-part2 "Deliveries": held is never attempted; attempts only before window_ends_at.
                assert maybe_due, r
                assert r["window_ends_at"] > now_before and r["destination_id"] in self.configured
                c = claimed[delivery_id]
                assert c.number == r["attempts"] + 1 and c.event_id == r["event_id"]
                assert after["lease_token"] == c.lease_token and after["state"] == "pending"
                started = after["lease_expires_at"] - timedelta(seconds=LEASE)  # the claim's now()
                self.in_flight.append((c, started + timedelta(seconds=self.elapsed)))
            elif not maybe_due:
                assert after == r, (r, after)  # claim_due touches only due Deliveries
            elif due and r["window_ends_at"] <= now_before:
                # a due Delivery past its window fails delivery_window_expired, without an attempt
                assert after["state"] == "failed" and after["last_error"]["code"] == store.WINDOW_EXPIRED
                assert after["attempts"] == r["attempts"]
            elif due and r["window_ends_at"] > now_after and r["destination_id"] not in self.configured:
                # decisions-part2 "Destinations": held destination_unconfigured, window still running
                assert after["state"] == "pending" and after["held"] == store.HELD_UNCONFIGURED
                assert after["window_ends_at"] == r["window_ends_at"]
            elif due:
                raise AssertionError(f"due and not claimed: {r} -> {after}")

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), result=st.sampled_from(sorted(RESULTS)))
    def record(self, data, result):
        index = data.draw(st.integers(0, len(self.in_flight) - 1))
        claim, started_virtual = self.in_flight.pop(index)
        status_code, error_code, retry_after = RESULTS[result]
        before = self.row(claim.delivery_id)
        finished = self.now()
        outcome = store.Outcome(started_at=started_virtual - timedelta(seconds=self.elapsed), finished_at=finished,
                                status_code=status_code, error_code=error_code,
                                response_excerpt="" if status_code is None else f"answer {status_code}",
                                retry_after=retry_after)
        state = self.run(store.record_attempt(self.conn, claim, outcome, DELIVERY))
        after = self.row(claim.delivery_id)
        if before["lease_token"] != claim.lease_token:
            # docs/decisions.md "Leases": another worker took the Delivery over; the late outcome is dropped.
            assert state is None and after == before
            return
        assert state == after["state"] and after["attempts"] == claim.number
        assert after["lease_token"] is None and after["last_attempt_at"] == finished
        made = self.attempt_rows(claim.delivery_id)[-1]
        assert (made["number"], made["status_code"], made["error_code"]) == (claim.number, status_code, error_code)
        held = before["held"]
        # decisions-part2 "Deliveries": 2xx -> succeeded; 410 -> failed destination_gone at once; 3xx is a failed
        # attempt; after the last scheduled attempt -> failed attempts_exhausted; else the next is due
        # retry_schedule[n] after this one finished, raised to Retry-After capped at max_retry_after_seconds.
        if status_code is not None and 200 <= status_code < 300:
            assert after["state"] == "succeeded" and after["last_error"] is None
        elif status_code == 410:
            assert after["state"] == "failed" and after["last_error"]["code"] == store.DESTINATION_GONE
            assert after["last_error"]["status_code"] == 410
        elif claim.number >= len(SCHEDULE):
            assert after["state"] == "failed" and after["last_error"]["code"] == store.ATTEMPTS_EXHAUSTED
        else:
            assert after["state"] == "pending" and after["last_error"]["code"] == error_code
            assert after["held"] == held  # a hold set while the attempt was in flight keeps it parked
            if held is None:
                delay = float(SCHEDULE[claim.number])
                if retry_after is not None:
                    delay = max(delay, min(float(retry_after), float(DELIVERY.max_retry_after_seconds)))
                assert after["next_attempt_at"] == finished + timedelta(seconds=delay)
            else:
                assert after["next_attempt_at"] is None
        if after["state"] != "pending":
            # docs/decisions.md "Holds": a terminal state keeps no hold, except subscription_deleted
            assert after["held"] == (store.HELD_DELETED if held == store.HELD_DELETED else None)

    @rule(gone=st.booleans())
    def destination_file_changes(self, gone):
        # decisions-part2 "Destinations": the startup file drops a destination, or names it again.
        if gone:
            self.configured.discard(SOMETIMES)
        else:
            self.configured.add(SOMETIMES)

    @rule()
    def release_destinations(self):
        # docs/decisions.md: every 5 s the worker releases held ones whose destination is named again (due
        # at once; past the window they fail when claimed).
        before = self.rows()
        now_before = self.now()
        self.run(store.release_configured_destinations(self.conn, set(self.configured)))
        for delivery_id, r in before.items():
            after = self.row(delivery_id)
            if r["held"] == store.HELD_UNCONFIGURED and r["destination_id"] in self.configured:
                assert after["held"] is None and after["state"] == "pending"
                assert after["next_attempt_at"] >= now_before
            else:
                assert after == r

    @rule(seconds=st.sampled_from([1, 4, 8, 25, 70]))
    def time_passes(self, seconds):
        # The store reads now() from the database: moving this machine's stored instants `seconds` into the
        # past is the clock moving forward that much for it.
        shift = timedelta(seconds=seconds)
        self.db.execute(
            """UPDATE deliveries SET created_at = created_at - %(s)s, next_attempt_at = next_attempt_at - %(s)s,
                   last_attempt_at = last_attempt_at - %(s)s, succeeded_at = succeeded_at - %(s)s,
                   failed_at = failed_at - %(s)s, window_ends_at = window_ends_at - %(s)s,
                   lease_expires_at = lease_expires_at - %(s)s WHERE org_id = %(org)s""", {"s": shift, "org": ORG})
        self.db.execute(
            """UPDATE delivery_attempts SET started_at = started_at - %(s)s, finished_at = finished_at - %(s)s
               WHERE delivery_id IN (SELECT delivery_id FROM deliveries WHERE org_id = %(org)s)""",
            {"s": shift, "org": ORG})
        self.elapsed += seconds

    # --------------------------------------------------------------- invariants

    @invariant()
    def the_contract_holds(self):
        rows = self.rows()
        assert set(rows) == set(self.known)
        # decisions-part2 "Deliveries": one Delivery per (Match, event type)
        pairs = [(r["match_id"], r["event_type"]) for r in rows.values()]
        assert len(pairs) == len(set(pairs))
        for delivery_id, r in rows.items():
            k = self.known[delivery_id]
            state, held = r["state"], r["held"]
            made = self.attempt_rows(delivery_id)
            # a terminal Delivery (succeeded / failed) never changes again
            if k["terminal"] is not None:
                assert self.snapshot(r) == k["terminal"], (k["terminal"], r)
            # held is parked: no next_attempt_at, never attempted; only a deleted Subscription's hold outlives
            # pending (docs/decisions.md "Holds": a terminal state keeps no hold except subscription_deleted)
            if held is not None:
                assert r["next_attempt_at"] is None, r
                assert state == "pending" or held == store.HELD_DELETED, r
            # subscription_deleted is never cleared
            if k["ever_deleted"]:
                assert held == store.HELD_DELETED, r
            # pending and not held is always due at some time (never stranded)
            if state == "pending" and held is None:
                assert r["next_attempt_at"] is not None, r
            # precedence: a deleted Subscription's pending ones are held deleted, a disabled one's held disabled
            sub = r["subscription_id"]
            if state == "pending":
                if self.deleted[sub]:
                    assert held == store.HELD_DELETED, r
                elif not self.enabled[sub]:
                    assert held == store.HELD_DISABLED, r
                else:
                    assert held in (None, store.HELD_UNCONFIGURED), r
            # attempts = the recorded Attempts, numbered 1..n
            assert [a["number"] for a in made] == list(range(1, r["attempts"] + 1)), (r, made)
            # a Delivery past its window is never attempted
            for a in made:
                assert r["window_ends_at"] is not None and a["started_at"] < r["window_ends_at"], (r, a)
            # window_ends_at = created_at + window_seconds; a match.withdrawn committed while held has none until
            # re-enable, then re-enable time + window_seconds
            window = timedelta(seconds=DELIVERY.window_seconds)
            if r["window_ends_at"] is None:
                assert k["windowless_at_creation"] and state == "pending" and held is not None and not made
            elif k["windowless_at_creation"]:
                assert r["window_ends_at"] >= r["created_at"] + window
            else:
                assert r["window_ends_at"] == r["created_at"] + window
            # states and last_error
            if state == "succeeded":
                assert r["succeeded_at"] is not None and r["failed_at"] is None and r["last_error"] is None
                assert made and made[-1]["status_code"] // 100 == 2 and r["next_attempt_at"] is None
            elif state == "failed":
                assert r["failed_at"] is not None and r["succeeded_at"] is None and r["next_attempt_at"] is None
                assert r["last_error"]["code"] in TERMINAL_CODES, r
                if r["last_error"]["code"] == store.DESTINATION_GONE:
                    assert made[-1]["status_code"] == 410 and r["last_error"]["status_code"] == 410
                if r["last_error"]["code"] == store.ATTEMPTS_EXHAUSTED:
                    assert r["attempts"] == len(SCHEDULE)
                # docs/decisions.md: a terminal failure keeps the last attempt's status_code
                if made:
                    assert r["last_error"].get("status_code") == made[-1]["status_code"], (r, made[-1])
            else:
                assert r["succeeded_at"] is None and r["failed_at"] is None
                assert (r["last_error"] is None) == (not made), r
                if made:
                    assert r["last_error"]["code"] in ATTEMPT_CODES
                    assert r["last_error"]["code"] == (made[-1]["error_code"] or "http_status")
            # every state or held change appended one delivery.changed, in the Match's Corpus; attempts none
            events = self.events(delivery_id)
            new = events[k["events"]:]
            if (state, held) != k["last"]:
                assert len(new) == 1, (k["last"], r, new)
                e = new[0]
                assert (e["org_id"], e["corpus_id"], e["public"], e["subject_type"]) == (
                    ORG, r["corpus_id"], True, "delivery")
                assert (e["payload"]["state"], e["payload"]["held"], e["payload"]["attempts"]) == (
                    state, held, r["attempts"])
            else:
                assert new == [], (r, new)
            k["events"], k["last"] = len(events), (state, held)
            if held == store.HELD_DELETED:
                k["ever_deleted"] = True
            if state != "pending" and k["terminal"] is None:
                k["terminal"] = self.snapshot(r)


def test_any_interleaving_keeps_the_delivery_contract(machine_database):
    # decisions-part2 "Deliveries" (whole); docs/decisions.md "Deliveries and the deliveries worker"
    DeliveryMachine.url = machine_database
    run_state_machine_as_test(DeliveryMachine, settings=settings(
        max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.parametrize("answer", ["2xx", "5xx"])
def test_an_attempt_in_flight_across_a_disable_and_an_enable_past_the_window_is_recorded_once(machine_database,
                                                                                             answer):
    # The machine's steps claim, disable, time_passes(70), enable, record: the invariant "a terminal Delivery
    # never changes again" broke. Enable failed the Delivery delivery_window_expired although its attempt
    # (admitted before the window) was still in flight; the outcome then moved the terminal Delivery to
    # succeeded (or back to pending).
    # decisions-part2 "Deliveries": disable holds, "in-flight attempts finish and are recorded"; attempts are
    # admitted only before window_ends_at; succeeded / failed are terminal.
    url = machine_database
    sub = f"sub_{uuid.uuid4().hex[:8]}"
    org = f"org-{uuid.uuid4().hex[:8]}"

    async def scenario() -> str:
        async with await AsyncConnection.connect(url) as conn:
            await conn.execute(
                """INSERT INTO subscriptions (subscription_id, org_id, revision, name, saved_query_id,
                       current_version_id, enabled, deleted, scope, created_at, updated_at)
                   VALUES (%s, %s, 1, %s, 'sq', 'subv', true, false, '{}', now(), now())""", (sub, org, sub))
            await conn.commit()
            async with journal_transaction(conn):
                d = await store.create_delivery(conn, store.Notice(
                    org_id=org, corpus_id="corpus-r", match_id=f"mat_{sub}", subscription_id=sub,
                    subscription_version_id="subv", saved_query_id="sq", saved_query_version_id="sqv",
                    record_id="rec", version_id="ver", destination_id=ALWAYS, event_type=store.MATCH_CREATED),
                    DELIVERY, await store.notice_hold(conn, sub))
            [claim] = [c for c in await store.claim_due(conn, DELIVERY, {ALWAYS}, 100)
                       if c.delivery_id == d.delivery_id]
            async with journal_transaction(conn):
                await append(conn, await store.hold_subscription(conn, sub, store.HELD_DISABLED))
            # the window passes while the attempt is in flight (time_passes, as in the machine)
            await conn.execute("UPDATE deliveries SET created_at = created_at - interval '70 s',"
                               " next_attempt_at = next_attempt_at - interval '70 s',"
                               " window_ends_at = window_ends_at - interval '70 s' WHERE delivery_id = %s",
                               (d.delivery_id,))
            await conn.commit()
            async with journal_transaction(conn):
                await append(conn, await store.release_subscription(conn, sub, DELIVERY))
            status, error, _ = RESULTS[answer]
            finished = (await (await conn.execute("SELECT now()")).fetchone())[0]
            await conn.commit()
            recorded = await store.record_attempt(conn, claim, store.Outcome(
                started_at=finished - timedelta(seconds=71), finished_at=finished, status_code=status,
                error_code=error, response_excerpt=""), DELIVERY)
            assert recorded is not None  # the outcome is recorded, not dropped
            await conn.execute("UPDATE deliveries SET next_attempt_at = next_attempt_at - interval '10 s'"
                               " WHERE delivery_id = %s", (d.delivery_id,))  # the retry's due time comes
            await conn.commit()
            await store.claim_due(conn, DELIVERY, {ALWAYS}, 100)  # due again past the window: fails, no attempt
            return d.delivery_id

    delivery_id = asyncio.run(scenario())
    with psycopg.connect(url, row_factory=dict_row) as db:
        row = db.execute("SELECT * FROM deliveries WHERE delivery_id = %s", (delivery_id,)).fetchone()
        made = db.execute("SELECT number, status_code FROM delivery_attempts WHERE delivery_id = %s",
                          (delivery_id,)).fetchall()
        moves = [(e["payload"]["state"], e["payload"]["held"]) for e in db.execute(
            "SELECT payload FROM journal WHERE kind = 'delivery.changed' AND subject_id = %s ORDER BY position",
            (delivery_id,)).fetchall()]
    assert [(a["number"], a["status_code"]) for a in made] == [(1, RESULTS[answer][0])]
    assert row["attempts"] == 1 and row["held"] is None and row["lease_token"] is None
    if answer == "2xx":
        assert row["state"] == "succeeded" and row["last_error"] is None
        assert moves == [("pending", "subscription_disabled"), ("pending", None), ("succeeded", None)]
    else:
        assert row["state"] == "failed" and row["last_error"]["code"] == store.WINDOW_EXPIRED
        assert moves == [("pending", "subscription_disabled"), ("pending", None), ("failed", None)]


@pytest.mark.parametrize("expired_by", ["claim", "enable"])
def test_a_delivery_failed_past_its_window_keeps_the_last_attempts_status_code(machine_database, expired_by):
    # Found by the machine above: a 3xx attempt, the window passes, the retry's claim (or an enable) fails the
    # Delivery delivery_window_expired, and last_error lost the 301. docs/decisions.md "Deliveries": a
    # terminal failure puts the reason in `code` and keeps the last attempt's `status_code`.
    url = machine_database
    sub = f"sub_{uuid.uuid4().hex[:8]}"

    async def scenario() -> str:
        async with await AsyncConnection.connect(url) as conn:
            await conn.execute(
                """INSERT INTO subscriptions (subscription_id, org_id, revision, name, saved_query_id,
                       current_version_id, enabled, deleted, scope, created_at, updated_at)
                   VALUES (%s, 'org-r', 1, %s, 'sq', 'subv', true, false, '{}', now(), now())""", (sub, sub))
            await conn.commit()
            async with journal_transaction(conn):
                d = await store.create_delivery(conn, store.Notice(
                    org_id="org-r", corpus_id="corpus-r", match_id=f"mat_{sub}", subscription_id=sub,
                    subscription_version_id="subv", saved_query_id="sq", saved_query_version_id="sqv",
                    record_id="rec", version_id="ver", destination_id=ALWAYS, event_type=store.MATCH_CREATED),
                    DELIVERY, None)
            [claim] = [c for c in await store.claim_due(conn, DELIVERY, {ALWAYS}, 100)
                       if c.delivery_id == d.delivery_id]
            finished = (await (await conn.execute("SELECT now()")).fetchone())[0]
            await conn.commit()
            assert await store.record_attempt(conn, claim, store.Outcome(
                started_at=finished, finished_at=finished, status_code=301, error_code="http_status",
                response_excerpt=""), DELIVERY) == "pending"
            if expired_by == "enable":
                async with journal_transaction(conn):
                    await append(conn, await store.hold_subscription(conn, sub, store.HELD_DISABLED))
            await conn.execute("UPDATE deliveries SET next_attempt_at = next_attempt_at - interval '70 s',"
                               " window_ends_at = window_ends_at - interval '70 s' WHERE delivery_id = %s",
                               (d.delivery_id,))  # the window passes
            await conn.commit()
            if expired_by == "enable":
                async with journal_transaction(conn):
                    await append(conn, await store.release_subscription(conn, sub, DELIVERY))
            else:
                await store.claim_due(conn, DELIVERY, {ALWAYS}, 100)
            return d.delivery_id

    delivery_id = asyncio.run(scenario())
    with psycopg.connect(url, row_factory=dict_row) as db:
        row = db.execute("SELECT * FROM deliveries WHERE delivery_id = %s", (delivery_id,)).fetchone()
        [payload] = [e["payload"] for e in db.execute(
            "SELECT payload FROM journal WHERE kind = 'delivery.changed' AND subject_id = %s ORDER BY position",
            (delivery_id,)).fetchall() if e["payload"]["state"] == "failed"]
    assert row["state"] == "failed" and row["attempts"] == 1
    assert (row["last_error"]["code"], row["last_error"]["status_code"]) == (store.WINDOW_EXPIRED, 301)
    assert payload["last_error"] == row["last_error"]
