"""Deliveries and Attempts (decisions-part2, "Deliveries"): the durable record of each notice of a
Match, its state machine, and the leases the `deliveries` worker sends under.

A Delivery row is the record of truth; each move of its `state` or `held` commits the public
`delivery.changed` (Corpus of the Match) in the same transaction. The functions that change rows
run inside the caller's open transaction and return the events to append, so that a caller
committing its own events (the evaluator's `match.created`, a Subscription's disable) appends them
all at once, last, as journal/store.append asks. The worker's own steps (`claim_due`,
`record_attempts`) open their own transactions.

States: `pending` -> `succeeded` (2xx) | `failed` (`destination_gone` on 410, `attempts_exhausted`
after the last scheduled attempt, `delivery_window_expired` when due past `window_ends_at`).
A pending Delivery with `held` set is parked: never attempted, no `next_attempt_at`.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Sequence

import msgspec
from msgspec import UNSET, UnsetType
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.config.settings import DeliverySettings
from contentsvc.domain.clock import iso
from contentsvc.ids import new_id
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.journal.store import append
from contentsvc.monitoring.delivery_events import DeliveryChanged
from contentsvc.monitoring.webhooks import WebhookEvent, webhook_body
from contentsvc.storage.database import database_now

MATCH_CREATED = "match.created"
MATCH_WITHDRAWN = "match.withdrawn"
HELD_DISABLED = "subscription_disabled"
HELD_DELETED = "subscription_deleted"
HELD_UNCONFIGURED = "destination_unconfigured"
DESTINATION_GONE = "destination_gone"
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
WINDOW_EXPIRED = "delivery_window_expired"
EXCERPT_BYTES = 512
LEASE_MARGIN_SECONDS = 5  # the lease of an attempt: its timeout + this


# ------------------------------------------------------------------------- views


class Delivery(msgspec.Struct, kw_only=True, omit_defaults=True):
    delivery_id: str
    event_id: str
    match_id: str
    subscription_id: str
    destination_id: str
    event_type: str
    state: str
    attempts: int
    created_at: str
    held: str | UnsetType = UNSET
    next_attempt_at: str | UnsetType = UNSET
    last_attempt_at: str | UnsetType = UNSET
    succeeded_at: str | UnsetType = UNSET
    failed_at: str | UnsetType = UNSET
    last_error: dict[str, Any] | UnsetType = UNSET
    window_ends_at: str | UnsetType = UNSET


class Attempt(msgspec.Struct, kw_only=True, omit_defaults=True):
    attempt_id: str
    delivery_id: str
    number: int
    started_at: str
    finished_at: str
    duration_ms: int
    response_excerpt: str
    status_code: int | UnsetType = UNSET
    error_code: str | UnsetType = UNSET


_DELIVERY_COLUMNS = """delivery_id, event_id, match_id, subscription_id, destination_id, event_type, state,
    attempts, created_at, held, next_attempt_at, last_attempt_at, succeeded_at, failed_at, last_error,
    window_ends_at"""


def _optional(value):
    if value is None:
        return UNSET
    return iso(value) if isinstance(value, datetime) else value


def _delivery(row) -> Delivery:
    (delivery_id, event_id, match_id, subscription_id, destination_id, event_type, state, attempts, created_at,
     held, next_attempt_at, last_attempt_at, succeeded_at, failed_at, last_error, window_ends_at) = row
    return Delivery(delivery_id=delivery_id, event_id=event_id, match_id=match_id, subscription_id=subscription_id,
                    destination_id=destination_id, event_type=event_type, state=state, attempts=attempts,
                    created_at=iso(created_at), held=_optional(held), next_attempt_at=_optional(next_attempt_at),
                    last_attempt_at=_optional(last_attempt_at), succeeded_at=_optional(succeeded_at),
                    failed_at=_optional(failed_at), last_error=_optional(last_error),
                    window_ends_at=_optional(window_ends_at))


async def get_delivery(conn: AsyncConnection, delivery_id: str) -> tuple[str, str, Delivery] | None:
    """(org_id, corpus_id, Delivery), or None."""
    cur = await conn.execute(f"SELECT org_id, corpus_id, {_DELIVERY_COLUMNS} FROM deliveries WHERE delivery_id = %s",
                             (delivery_id,))
    row = await cur.fetchone()
    return None if row is None else (row[0], row[1], _delivery(row[2:]))


async def list_attempts(conn: AsyncConnection, delivery_id: str, after_number: int = 0,
                        limit: int = 100) -> list[Attempt]:
    """Attempts in ascending `number`, after `after_number`."""
    cur = await conn.execute(
        "SELECT attempt_id, delivery_id, number, started_at, finished_at, duration_ms, response_excerpt,"
        " status_code, error_code FROM delivery_attempts WHERE delivery_id = %s AND number > %s"
        " ORDER BY number LIMIT %s", (delivery_id, after_number, limit))
    return [Attempt(attempt_id=r[0], delivery_id=r[1], number=r[2], started_at=iso(r[3]), finished_at=iso(r[4]),
                    duration_ms=r[5], response_excerpt=r[6], status_code=_optional(r[7]), error_code=_optional(r[8]))
            for r in await cur.fetchall()]


# ------------------------------------------------------------------------- schedule (pure)


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A `Retry-After` header's delay: delta-seconds or an HTTP date; None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        digits = value.lstrip("0") or "0"
        # Any value this long is far past the cap; int() and float() of it would raise.
        return float(int(digits)) if len(digits) <= 12 else 1e12
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def next_delay(settings: DeliverySettings, number: int, retry_after: float | None,
               rng: random.Random | None = None) -> float:
    """Seconds between the end of attempt `number` (1-based) and attempt `number + 1`: the schedule's
    entry, jittered ×U(1-jitter, 1+jitter) unless it is 0, raised to a Retry-After capped at
    `max_retry_after_seconds`. Only called while a scheduled attempt remains."""
    base = float(settings.retry_schedule[number])
    if base > 0 and settings.jitter > 0:
        base *= (rng or random).uniform(1 - settings.jitter, 1 + settings.jitter)
    if retry_after is not None:
        base = max(base, min(retry_after, float(settings.max_retry_after_seconds)))
    return base


@dataclass(frozen=True)
class Outcome:
    """What one attempt saw (the worker fills it; nothing of the request is kept)."""

    started_at: datetime
    finished_at: datetime
    status_code: int | None
    error_code: str | None  # timeout, connect_error, tls_error, http_status, invalid_response
    response_excerpt: str
    retry_after: str | None = None  # the raw Retry-After header of a non-2xx answer

    @property
    def duration_ms(self) -> int:
        return max(0, round((self.finished_at - self.started_at).total_seconds() * 1000))

    @property
    def succeeded(self) -> bool:
        return self.error_code is None and self.status_code is not None and 200 <= self.status_code < 300


def excerpt(body: bytes) -> str:
    """The first 512 bytes of a response body, decoded as UTF-8 with replacement; a NUL, which a
    PostgreSQL text cannot hold, is replaced too (U+FFFD), so that no answer makes its Attempt
    unrecordable."""
    return body[:EXCERPT_BYTES].decode("utf-8", errors="replace").replace("\x00", "\ufffd")


# ------------------------------------------------------------------------- events


def _changed(org_id: str, corpus_id: str, delivery_id: str, match_id: str, state: str, held: str | None,
             attempts: int, changed_at: datetime, last_error: dict | None = None) -> NewEvent:
    payload = DeliveryChanged(delivery_id=delivery_id, match_id=match_id, state=state, held=held, attempts=attempts,
                              last_error=UNSET if last_error is None else last_error, changed_at=iso(changed_at))
    return NewEvent(org_id=org_id, corpus_id=corpus_id, subject_type="delivery", subject_id=delivery_id,
                    payload=payload)


def _window_expired(now: datetime, last_error: dict | None) -> dict:
    """The last_error of a Delivery failed `delivery_window_expired`: like every terminal failure it keeps
    the last attempt's `status_code` (docs/decisions.md, Deliveries: `last_error`)."""
    error: dict[str, Any] = {"code": WINDOW_EXPIRED, "at": iso(now)}
    if last_error and last_error.get("status_code") is not None:
        error["status_code"] = last_error["status_code"]
    return error


# ------------------------------------------------------------------------- creation


@dataclass(frozen=True)
class Notice:
    """A Match's notice, as the evaluator commits it."""

    org_id: str
    corpus_id: str  # the Corpus of the Match
    match_id: str
    subscription_id: str
    subscription_version_id: str
    saved_query_id: str
    saved_query_version_id: str
    record_id: str
    version_id: str
    destination_id: str  # the one of the Subscription Version that produced the Match
    event_type: str  # match.created or match.withdrawn
    owner: str | None = None


def _delivery_row(notice: Notice, held: str | None, now: datetime, settings: DeliverySettings) -> tuple:
    """A new Delivery's columns, in the INSERT's order: its body is built once here and every
    attempt sends these bytes."""
    event_id = new_id("wev")
    body = webhook_body(WebhookEvent(
        event_id=event_id, type=notice.event_type, created_at=iso(now), subscription_id=notice.subscription_id,
        subscription_version_id=notice.subscription_version_id, saved_query_id=notice.saved_query_id,
        saved_query_version_id=notice.saved_query_version_id, match_id=notice.match_id, corpus_id=notice.corpus_id,
        record_id=notice.record_id, version_id=notice.version_id,
        owner=UNSET if notice.owner is None else notice.owner))
    window = None if held is not None and notice.event_type == MATCH_WITHDRAWN \
        else now + timedelta(seconds=settings.window_seconds)
    due = None if held is not None else now + timedelta(seconds=settings.retry_schedule[0])
    return (new_id("dlv"), event_id, notice.org_id, notice.corpus_id, notice.match_id, notice.subscription_id,
            notice.destination_id, notice.event_type, held, due, now, window, body)


async def create_delivery(conn: AsyncConnection, notice: Notice, settings: DeliverySettings,
                          held: str | None = None) -> Delivery:
    """The notice's Delivery, inside the caller's transaction (the one committing the Match event).

    `held` is the Subscription's state at the commit: `subscription_disabled` or `subscription_deleted`
    park it. Its window runs from now, except a `match.withdrawn` notice committed for a disabled or
    deleted Subscription, which has none until a re-enable. Its first attempt is due
    `retry_schedule[0]` after the commit (never jittered). One Delivery per (Match, event type): a
    second call returns the first. Creation itself commits no `delivery.changed` (the Match's own
    event announces it); its later moves do.
    """
    now = await database_now(conn)
    row = _delivery_row(notice, held, now, settings)
    cur = await conn.execute(
        f"""INSERT INTO deliveries (delivery_id, event_id, org_id, corpus_id, match_id, subscription_id,
                destination_id, event_type, held, next_attempt_at, created_at, window_ends_at, body)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (match_id, event_type) DO NOTHING RETURNING {_DELIVERY_COLUMNS}""", row)
    row = await cur.fetchone()
    if row is None:
        cur = await conn.execute(f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE match_id = %s AND event_type = %s",
                                 (notice.match_id, notice.event_type))
        row = await cur.fetchone()
    return _delivery(row)


async def create_deliveries_many(conn: AsyncConnection, notices: list[tuple[Notice, str | None]],
                                 settings: DeliverySettings) -> None:
    """create_delivery for many (notice, held) at once, in one statement: what the evaluator commits
    for a step's Matches. The same rows as create_delivery's (now() is the transaction's, so one
    read serves them all); one Delivery per (Match, event type), a second is not inserted."""
    if not notices:
        return
    now = await database_now(conn)
    columns = [list(column) for column in zip(*(_delivery_row(notice, held, now, settings) for notice, held in notices))]
    await conn.execute(
        """INSERT INTO deliveries (delivery_id, event_id, org_id, corpus_id, match_id, subscription_id,
                destination_id, event_type, held, next_attempt_at, created_at, window_ends_at, body)
            SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
                                 %b::text[], %b::text[], %b::timestamptz[], %b::timestamptz[], %b::timestamptz[],
                                 %b::bytea[])
            ON CONFLICT (match_id, event_type) DO NOTHING""", columns)


# ------------------------------------------------------------------------- holds


async def notice_hold(conn: AsyncConnection, subscription_id: str) -> str | None:
    """The `held` a notice committed now for this Subscription takes (create_delivery's `held`):
    `subscription_deleted`, `subscription_disabled`, or None while it is enabled. Reads the
    Subscription's row FOR SHARE inside the caller's transaction, so it waits for a disable, enable
    or delete being committed (they lock the row FOR UPDATE before moving the holds) and such a
    command waits for this transaction: a notice is never created unheld after a disable that did
    not see it."""
    return (await notice_holds(conn, [subscription_id]))[subscription_id]


async def notice_holds(conn: AsyncConnection, subscription_ids: list[str]) -> dict[str, str | None]:
    """notice_hold for many Subscriptions in one statement (rows read FOR SHARE in id order). A
    Subscription that does not exist is held for good: nothing may ever be sent for it."""
    cur = await conn.execute("SELECT subscription_id, enabled, deleted FROM subscriptions"
                             " WHERE subscription_id = ANY(%s) ORDER BY subscription_id FOR SHARE",
                             (sorted(set(subscription_ids)),))
    found = {sid: HELD_DELETED if deleted else None if enabled else HELD_DISABLED
             for sid, enabled, deleted in await cur.fetchall()}
    return {sid: found.get(sid, HELD_DELETED) for sid in subscription_ids}


async def hold_subscription(conn: AsyncConnection, subscription_id: str, reason: str) -> list[NewEvent]:
    """Disable (`subscription_disabled`) or delete (`subscription_deleted`): park every pending Delivery
    of the Subscription, inside the caller's transaction; returns the `delivery.changed` events to
    append. An attempt in flight finishes and is recorded (record_attempts keeps the hold). A deleted
    Subscription's hold is never replaced; a disable replaces `destination_unconfigured`."""
    if reason not in (HELD_DISABLED, HELD_DELETED):
        raise ValueError(reason)
    replaceable = [HELD_UNCONFIGURED] if reason == HELD_DISABLED else [HELD_UNCONFIGURED, HELD_DISABLED]
    # The rows are locked in delivery_id order first, the order the worker's batches lock them in
    # (record_attempts): the two never deadlock.
    cur = await conn.execute(
        """UPDATE deliveries SET held = %s, next_attempt_at = NULL
           WHERE delivery_id IN (SELECT delivery_id FROM deliveries
                                 WHERE subscription_id = %s AND state = 'pending' AND (held IS NULL OR held = ANY(%s))
                                 ORDER BY delivery_id FOR UPDATE)
             AND state = 'pending' AND (held IS NULL OR held = ANY(%s))
           RETURNING org_id, corpus_id, delivery_id, match_id, attempts, now()""",
        (reason, subscription_id, replaceable, replaceable))
    return [_changed(org, corpus, delivery_id, match_id, "pending", reason, attempts, now)
            for org, corpus, delivery_id, match_id, attempts, now in await cur.fetchall()]


async def release_subscription(conn: AsyncConnection, subscription_id: str,
                               settings: DeliverySettings) -> list[NewEvent]:
    """Enable: every Delivery held `subscription_disabled` becomes due at once, inside the caller's
    transaction. A `match.withdrawn` notice committed while disabled gets its window now
    (re-enable + window_seconds); a Delivery whose window has passed fails `delivery_window_expired`
    without an attempt.

    Except one still leased: its attempt, admitted before the window, was in flight at the disable
    and is recorded when it finishes (record_attempt). Failing it here would let that outcome move a
    terminal Delivery again; it is released due instead, and claim_due fails it
    `delivery_window_expired` once the attempt is recorded or its lease ends."""
    now = await database_now(conn)
    cur = await conn.execute(
        """SELECT org_id, corpus_id, delivery_id, match_id, attempts, window_ends_at, lease_token, last_error
           FROM deliveries
           WHERE subscription_id = %s AND state = 'pending' AND held = %s ORDER BY delivery_id FOR UPDATE""",
        (subscription_id, HELD_DISABLED))
    events = []
    for org, corpus, delivery_id, match_id, attempts, window, lease_token, last_error in await cur.fetchall():
        if window is None:
            window = now + timedelta(seconds=settings.window_seconds)
        if window <= now and lease_token is None:
            error = _window_expired(now, last_error)
            await conn.execute(
                """UPDATE deliveries SET state = 'failed', held = NULL, next_attempt_at = NULL, failed_at = %s,
                   last_error = %s WHERE delivery_id = %s""", (now, Jsonb(error), delivery_id))
            events.append(_changed(org, corpus, delivery_id, match_id, "failed", None, attempts, now, error))
        else:
            await conn.execute(
                "UPDATE deliveries SET held = NULL, next_attempt_at = %s, window_ends_at = %s WHERE delivery_id = %s",
                (now, window, delivery_id))
            events.append(_changed(org, corpus, delivery_id, match_id, "pending", None, attempts, now))
    return events


# ------------------------------------------------------------------------- the worker's steps


@dataclass(frozen=True)
class Claim:
    """One attempt a worker may send: the lease is its own until `lease_token` is replaced."""

    delivery_id: str
    event_id: str
    destination_id: str
    body: bytes
    number: int
    lease_token: str


async def claim_due(conn: AsyncConnection, settings: DeliverySettings, configured: set[str],
                    limit: int) -> list[Claim]:
    """One transaction: the due Deliveries no live lease holds, locked with SKIP LOCKED so that two
    workers never take the same one. Each due one past its window fails `delivery_window_expired`;
    one whose destination the startup file does not name is held `destination_unconfigured`
    (its window keeps running); the others are leased for the attempt timeout + 5 s."""
    async with journal_transaction(conn):
        claims, events = await _claim(conn, settings, configured, limit)
        await append(conn, events)
    return claims


async def _claim(conn: AsyncConnection, settings: DeliverySettings, configured: set[str],
                 limit: int) -> tuple[list[Claim], list[NewEvent]]:
    """claim_due's statements, inside the caller's transaction; the events are the caller's to append."""
    lease_seconds = settings.attempt_timeout_seconds + LEASE_MARGIN_SECONDS
    claims: list[Claim] = []
    cur = await conn.execute(
        """SELECT now(), org_id, corpus_id, delivery_id, match_id, event_id, destination_id, body, attempts,
                  window_ends_at, last_error FROM deliveries
           WHERE state = 'pending' AND held IS NULL AND next_attempt_at <= now()
             AND (lease_expires_at IS NULL OR lease_expires_at <= now())
           ORDER BY next_attempt_at LIMIT %s FOR UPDATE SKIP LOCKED""", (limit,))
    events = []
    for now, org, corpus, delivery_id, match_id, event_id, destination_id, body, attempts, window, last_error \
            in await cur.fetchall():
        if window is not None and window <= now:
            error = _window_expired(now, last_error)
            await conn.execute(
                """UPDATE deliveries SET state = 'failed', next_attempt_at = NULL, failed_at = %s,
                   last_error = %s, lease_token = NULL, lease_expires_at = NULL WHERE delivery_id = %s""",
                (now, Jsonb(error), delivery_id))
            events.append(_changed(org, corpus, delivery_id, match_id, "failed", None, attempts, now, error))
        elif destination_id not in configured:
            await conn.execute("UPDATE deliveries SET held = %s, next_attempt_at = NULL WHERE delivery_id = %s",
                               (HELD_UNCONFIGURED, delivery_id))
            events.append(_changed(org, corpus, delivery_id, match_id, "pending", HELD_UNCONFIGURED, attempts,
                                   now))
        else:
            claims.append(Claim(delivery_id, event_id, destination_id, bytes(body), attempts + 1,
                                uuid.uuid4().hex))
    if claims:
        await conn.execute(
            """UPDATE deliveries d SET lease_token = k.token, lease_expires_at = now() + make_interval(secs => %s)
               FROM unnest(%b::text[], %b::text[]) AS k(delivery_id, token) WHERE d.delivery_id = k.delivery_id""",
            (lease_seconds, [c.delivery_id for c in claims], [c.lease_token for c in claims]))
    return claims, events


async def release_configured_destinations(conn: AsyncConnection, configured: set[str]) -> int:
    """Deliveries held `destination_unconfigured` whose destination the startup file names again
    become due at once (their window kept running; claim_due fails those past it)."""
    async with journal_transaction(conn):
        cur = await conn.execute(
            """UPDATE deliveries SET held = NULL, next_attempt_at = now()
               WHERE state = 'pending' AND held = %s AND destination_id = ANY(%s)
               RETURNING org_id, corpus_id, delivery_id, match_id, attempts, now()""",
            (HELD_UNCONFIGURED, sorted(configured)))
        rows = await cur.fetchall()
        await append(conn, [_changed(org, corpus, delivery_id, match_id, "pending", None, attempts, now)
                            for org, corpus, delivery_id, match_id, attempts, now in rows])
    return len(rows)


@dataclass(frozen=True)
class _Verdict:
    """What an outcome makes of its Delivery, computed before anything is locked or written."""

    state: str
    last_error: dict | None
    next_at: datetime | None  # the next attempt's due time while unheld (pending only)


def _verdict(claim: Claim, outcome: Outcome, settings: DeliverySettings) -> _Verdict:
    """2xx -> succeeded; 410 -> failed destination_gone; any other answer or error -> the next
    scheduled attempt (Retry-After raising its delay), or failed attempts_exhausted after the last."""
    finished = outcome.finished_at
    attempt_error = None if outcome.succeeded else {
        "code": outcome.error_code or "http_status", "at": iso(finished),
        **({"status_code": outcome.status_code} if outcome.status_code is not None else {})}
    if outcome.succeeded:
        return _Verdict("succeeded", None, None)
    if outcome.status_code == 410:
        return _Verdict("failed", {**attempt_error, "code": DESTINATION_GONE}, None)
    if claim.number >= len(settings.retry_schedule):
        return _Verdict("failed", {**attempt_error, "code": ATTEMPTS_EXHAUSTED}, None)
    delay = next_delay(settings, claim.number, retry_after_seconds(outcome.retry_after, finished))
    return _Verdict("pending", attempt_error, finished + timedelta(seconds=delay))


async def record_attempts(conn: AsyncConnection, recorded: Sequence[tuple[Claim, Outcome]],
                          settings: DeliverySettings) -> list[str | None]:
    """One transaction for a worker step's outcomes: each Attempt and its Delivery's new state,
    for every Delivery whose lease is still that claim's, and one journal append for all their
    `delivery.changed`. A Delivery whose lease was lost (another worker took it over after the
    lease expired and records its own attempt of the same number) drops only its own outcome: the
    notice was still sent at least once. Returns each outcome's new state, None when its lease
    was lost. All or nothing: if anything raises, nothing of the batch is written (the worker
    then records the outcomes one by one, deliverer.py).

    A hold set while the attempt was in flight keeps the Delivery parked; a terminal state
    leaves no hold except `subscription_deleted` (never cleared)."""
    if not recorded:
        return []
    # Every move is computed before the transaction: a bad outcome raises before any lock or write.
    verdicts = [_verdict(claim, outcome, settings) for claim, outcome in recorded]
    async with journal_transaction(conn):
        states, events = await _record(conn, recorded, verdicts)
        await append(conn, events)
    return states


async def record_and_claim(conn: AsyncConnection, recorded: Sequence[tuple[Claim, Outcome]],
                           settings: DeliverySettings, configured: set[str],
                           limit: int) -> tuple[list[str | None], list[Claim]]:
    """record_attempts and claim_due in one transaction and one journal append: the worker's step
    when the receiver answers fast, so every outcome costs a share of one commit, not two."""
    verdicts = [_verdict(claim, outcome, settings) for claim, outcome in recorded]
    async with journal_transaction(conn):
        states, events = await _record(conn, recorded, verdicts) if recorded else ([], [])
        claims, claim_events = await _claim(conn, settings, configured, limit) if limit > 0 else ([], [])
        await append(conn, events + claim_events)
    return states, claims


async def _record(conn: AsyncConnection, recorded: Sequence[tuple[Claim, Outcome]],
                  verdicts: list[_Verdict]) -> tuple[list[str | None], list[NewEvent]]:
    """record_attempts' statements, inside the caller's transaction."""
    states: list[str | None] = [None] * len(recorded)
    # Locked in delivery_id order, as every batch of every worker locks them: no deadlock.
    cur = await conn.execute(
        """SELECT delivery_id, lease_token, org_id, corpus_id, match_id, state, held FROM deliveries
           WHERE delivery_id = ANY(%s) ORDER BY delivery_id FOR UPDATE""",
        ([claim.delivery_id for claim, _ in recorded],))
    rows = {(row[0], row[1]): row[2:] for row in await cur.fetchall()}
    attempts, updates, events = [], [], []
    for i, ((claim, outcome), verdict) in enumerate(zip(recorded, verdicts)):
        row = rows.pop((claim.delivery_id, claim.lease_token), None)  # pop: a claim is recorded once
        if row is None:
            continue  # the lease was lost
        org, corpus, match_id, old_state, held = row
        finished = outcome.finished_at
        state, last_error = verdict.state, verdict.last_error
        next_at = verdict.next_at if held is None else None
        new_held = held if state == "pending" or held == HELD_DELETED else None
        attempts.append((new_id("att"), claim.delivery_id, claim.number, outcome.started_at, finished,
                         outcome.status_code, outcome.error_code, outcome.duration_ms, outcome.response_excerpt))
        updates.append((state, new_held, claim.number, next_at, finished,
                        None if last_error is None else Jsonb(last_error), claim.delivery_id))
        if state != old_state or new_held != held:
            events.append(_changed(org, corpus, claim.delivery_id, match_id, state, new_held, claim.number,
                                   finished, last_error))
        states[i] = state
    if attempts:
        # One statement each for the whole step, not one per outcome: a step records about as many
        # outcomes as its worker has attempts in flight (docs/decisions.md, "Outbound HTTP").
        await conn.execute(
            """INSERT INTO delivery_attempts (attempt_id, delivery_id, number, started_at, finished_at,
                   status_code, error_code, duration_ms, response_excerpt)
               SELECT * FROM unnest(%s::text[], %s::text[], %s::int[], %s::timestamptz[], %s::timestamptz[],
                                    %s::int[], %s::text[], %s::int[], %s::text[])
               ON CONFLICT (delivery_id, number) DO NOTHING""",
            [list(column) for column in zip(*attempts)])
        await conn.execute(
            """UPDATE deliveries d SET state = u.state, held = u.held, attempts = u.number,
                   next_attempt_at = u.next_at, last_attempt_at = u.finished,
                   succeeded_at = CASE WHEN u.state = 'succeeded' THEN u.finished END,
                   failed_at = CASE WHEN u.state = 'failed' THEN u.finished END, last_error = u.last_error,
                   lease_token = NULL, lease_expires_at = NULL
               FROM unnest(%s::text[], %s::text[], %s::int[], %s::timestamptz[], %s::timestamptz[],
                           %s::jsonb[], %s::text[]) AS u(state, held, number, next_at, finished, last_error,
                                                          delivery_id)
               WHERE d.delivery_id = u.delivery_id""",
            [list(column) for column in zip(*updates)])
    return states, events


async def record_attempt(conn: AsyncConnection, claim: Claim, outcome: Outcome,
                         settings: DeliverySettings) -> str | None:
    """record_attempts for one outcome: its own transaction; the new state, None when the lease was lost."""
    return (await record_attempts(conn, [(claim, outcome)], settings))[0]


async def next_due_in(conn: AsyncConnection) -> float | None:
    """Seconds until the earliest pending, unheld Delivery is due (or its lease ends); None when none."""
    async with conn.transaction():
        cur = await conn.execute(
            """SELECT extract(epoch FROM min(greatest(next_attempt_at, coalesce(lease_expires_at, next_attempt_at)))
                      - now()) FROM deliveries WHERE state = 'pending' AND held IS NULL""")
        row = await cur.fetchone()
    return None if row[0] is None else max(0.0, float(row[0]))
