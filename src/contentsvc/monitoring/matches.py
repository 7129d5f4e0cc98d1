"""Matches and the `monitor` worker's evaluation state (decisions-part2 "Evaluation trigger and
eligibility", "Matches"; schema/020). The one writer of `matches`, `monitor_evaluations`,
`monitor_subscription_history` and `monitor_subscription_status`.

Every function runs inside the caller's open transaction and returns the journal events to
append, so a Match, its Delivery and its change event commit together (the caller appends last).

The fold side (`fold_*`) runs in the monitor's checkpoint transaction, event by event in journal
order; Subscriptions are read as they were at the event's position (`monitor_subscription_history`),
so folding the journal again from an earlier checkpoint decides as the first time:

- `subscription.committed` records the Subscription's judging Version and enabled state at its
  position; a disable or delete drops its evaluations triggered before it (disable blocks new
  evaluation commits).
- the `record.availability_changed` that makes a Version current and searchable triggers one
  evaluation per live Subscription whose Version pins its Corpus (only above the trigger mark: a
  trigger folded before arms nothing again), and re-arms a `not_ready` one;
- `record.enriched` marks the Version enriched (the request's `enriched`) and re-arms a `not_ready` one;
- a Version no longer current (the currentness-only `is_current: false`) withdraws its active
  Matches (`version_replaced`) and drops its pending evaluations; `record.withdrawn` does the
  same for every Version of the Record (`record_withdrawn`).

`monitor_evaluations` holds pending evaluations only: deciding, failing or dropping one deletes
its row (schema/031).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from contentsvc.config.settings import DeliverySettings
from contentsvc.domain.clock import iso
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.monitoring import events as me
from contentsvc.monitoring.deliveries import (
    MATCH_CREATED,
    MATCH_WITHDRAWN,
    Notice,
    create_deliveries_many,
    create_delivery,
    notice_hold,
    notice_holds,
)
from contentsvc.monitoring.match_events import MATCH_SUBJECT, MatchCreated, MatchWithdrawn
from contentsvc.domain.models import Output
from contentsvc.storage.database import database_now

RECORD_WITHDRAWN = "record_withdrawn"
VERSION_REPLACED = "version_replaced"
EVALUATOR_FAILED = "evaluator_failed"
EVALUATOR_INVALID_OUTPUT = "evaluator_invalid_output"


# ------------------------------------------------------------------------- views


class MatchDeliveryRef(Output, kw_only=True):
    delivery_id: str
    event_type: str
    state: str


class Evidence(Output, kw_only=True):
    explanation: str
    part_keys: list[str]
    details: dict[str, Any]


class Match(Output, kw_only=True):
    match_id: str
    subscription_id: str
    subscription_version_id: str
    saved_query_version_id: str
    corpus_id: str
    record_id: str
    version_id: str
    evidence: Evidence
    state: str  # active or withdrawn
    deliveries: list[MatchDeliveryRef]
    created_at: str
    withdrawn_reason: str | UnsetType = UNSET  # record_withdrawn or version_replaced
    withdrawn_at: str | UnsetType = UNSET


class MatchPage(Output, kw_only=True):
    items: list[Match]
    next_page_cursor: str | UnsetType = UNSET


_MATCH_COLUMNS = """m.match_id, m.subscription_id, m.subscription_version_id, m.saved_query_version_id, m.corpus_id,
    m.record_id, m.version_id, m.evidence, m.state, m.created_at, m.withdrawn_reason, m.withdrawn_at,
    coalesce((SELECT jsonb_agg(jsonb_build_object('delivery_id', d.delivery_id, 'event_type', d.event_type,
                                                  'state', d.state) ORDER BY d.delivery_id)
              FROM deliveries d WHERE d.match_id = m.match_id), '[]'::jsonb) AS deliveries"""


def _match(row: dict) -> Match:
    return Match(
        match_id=row["match_id"], subscription_id=row["subscription_id"],
        subscription_version_id=row["subscription_version_id"], saved_query_version_id=row["saved_query_version_id"],
        corpus_id=row["corpus_id"], record_id=row["record_id"], version_id=row["version_id"],
        evidence=msgspec.convert(row["evidence"], Evidence), state=row["state"],
        deliveries=[MatchDeliveryRef(**d) for d in row["deliveries"]], created_at=iso(row["created_at"]),
        withdrawn_reason=row["withdrawn_reason"] or UNSET,
        withdrawn_at=iso(row["withdrawn_at"]) if row["withdrawn_at"] is not None else UNSET)


async def visible_match(conn: AsyncConnection, org_id: str, scope: list[str] | None, match_id: str) -> Match | None:
    """rule 8: a Match of a Subscription whose pinned Corpora the key all grants (`scope` None: all)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"SELECT {_MATCH_COLUMNS} FROM matches m JOIN subscriptions s ON s.subscription_id = m.subscription_id"
        " WHERE m.org_id = %s AND m.match_id = %s AND (%b::text[] IS NULL OR s.scope <@ %b::text[])",
        (org_id, match_id, scope, scope))
    row = await cur.fetchone()
    return None if row is None else _match(row)


async def list_matches(conn: AsyncConnection, org_id: str, scope: list[str] | None, subscription_id: str | None,
                       record_id: str | None, state: str | None, after: str | None, limit: int) -> list[Match]:
    """Ascending id, filtered; only Matches of Subscriptions whose pinned Corpora the key all grants."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"SELECT {_MATCH_COLUMNS} FROM matches m JOIN subscriptions s ON s.subscription_id = m.subscription_id"
        " WHERE m.org_id = %s AND m.match_id > %s AND (%b::text[] IS NULL OR s.scope <@ %b::text[])"
        "   AND (%s::text IS NULL OR m.subscription_id = %s::text) AND (%s::text IS NULL OR m.record_id = %s::text)"
        "   AND (%s::text IS NULL OR m.state = %s::text)"
        " ORDER BY m.match_id LIMIT %s",
        (org_id, after or "", scope, scope, subscription_id, subscription_id, record_id, record_id, state, state,
         limit))
    return [_match(row) for row in await cur.fetchall()]


# ------------------------------------------------------------------------- the fold


async def fold_subscription(conn: AsyncConnection, e: JournalEvent) -> None:
    """The Subscription's state at this position; a disable or delete drops its evaluations
    triggered before it (disable blocks new evaluation commits)."""
    p: me.SubscriptionCommitted = e.payload
    if p.version is not UNSET:
        corpus_ids = p.version.corpus_ids
    else:
        cur = await conn.execute("SELECT corpus_ids FROM monitor_subscription_history WHERE subscription_id = %s"
                                 " AND position < %s ORDER BY position DESC LIMIT 1", (p.subscription_id, e.position))
        row = await cur.fetchone()
        if row is None:  # cannot happen: a Subscription's first fact carries its Version
            return
        corpus_ids = row[0]
    await conn.execute(
        "INSERT INTO monitor_subscription_history (subscription_id, position, org_id, version_id, corpus_ids, enabled,"
        " deleted) VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (p.subscription_id, e.position, e.org_id, p.current_version_id, corpus_ids, p.enabled, p.deleted))
    if not p.enabled or p.deleted:
        await conn.execute("DELETE FROM monitor_evaluations WHERE subscription_id = %s AND trigger_position < %s",
                           (p.subscription_id, e.position))


def makes_current(p: ev.RecordAvailabilityChanged) -> bool:
    return p.is_current is True and p.searchable is True


def ends_currentness(p: ev.RecordAvailabilityChanged) -> bool:
    """The currentness-only event of a Version a newer one replaced (projectors/currentness.py)."""
    return p.is_current is False and p.state is UNSET


async def fold_made_current(conn: AsyncConnection, events: list[JournalEvent], not_ready_max_seconds: int) -> None:
    """For each event above the trigger mark, one pending evaluation per live Subscription whose
    judging Version (the latest before the event) pins the event's Corpus; a `not_ready` one of its
    Version is due again (or dropped past `not_ready_max_seconds`). One statement for the whole run.

    An evaluation leaves `monitor_evaluations` when it ends, so the table cannot tell a trigger
    folded before from a new one: `monitor_trigger_mark` does (schema/031). A fold of the journal
    again (its checkpoint reset) arms nothing at or below it; what it would arm there is what the
    first fold armed, Subscriptions being read as they were at each event's position."""
    if not events:
        return
    await conn.execute(
        "INSERT INTO monitor_evaluations (subscription_version_id, version_id, subscription_id, org_id, corpus_id,"
        "                                 record_id, trigger_position, next_attempt_at)"
        " SELECT s.version_id, e.version_id, s.subscription_id, s.org_id, e.corpus_id, e.record_id, e.position, now()"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::bigint[])"
        "      AS e(version_id, org_id, corpus_id, record_id, position)"
        " CROSS JOIN LATERAL (SELECT DISTINCT ON (h.subscription_id) h.* FROM monitor_subscription_history h"
        "       WHERE h.org_id = e.org_id AND h.position < e.position ORDER BY h.subscription_id, h.position DESC) s"
        " WHERE s.enabled AND NOT s.deleted AND e.corpus_id = ANY(s.corpus_ids)"
        "   AND e.position > (SELECT position FROM monitor_trigger_mark)"
        " ON CONFLICT DO NOTHING",
        ([e.payload.version_id for e in events], [e.org_id for e in events], [e.corpus_id for e in events],
         [e.payload.record_id for e in events], [e.position for e in events]))
    await conn.execute("UPDATE monitor_trigger_mark SET position = %s WHERE position < %s",
                       (events[-1].position, events[-1].position))
    await rearm_not_ready(conn, [e.payload.version_id for e in events], not_ready_max_seconds)


async def fold_enriched(conn: AsyncConnection, version_ids: list[str], not_ready_max_seconds: int) -> None:
    if not version_ids:
        return
    await conn.execute("INSERT INTO monitor_enriched_versions (version_id) SELECT unnest(%s::text[])"
                       " ON CONFLICT DO NOTHING", (version_ids,))
    await rearm_not_ready(conn, version_ids, not_ready_max_seconds)


async def is_enriched(conn: AsyncConnection, version_id: str) -> bool:
    cur = await conn.execute("SELECT 1 FROM monitor_enriched_versions WHERE version_id = %s", (version_id,))
    return await cur.fetchone() is not None


async def rearm_not_ready(conn: AsyncConnection, version_ids: list[str], not_ready_max_seconds: int) -> None:
    """decisions-part2: not_ready is evaluated again at the next record.enriched or
    record.availability_changed of the Version; dropped after not_ready_max_seconds."""
    await conn.execute(
        "UPDATE monitor_evaluations SET next_attempt_at = now()"
        " WHERE version_id = ANY(%s) AND next_attempt_at IS NULL"
        "   AND coalesce(first_not_ready_at, now()) + make_interval(secs => %s) >= now()",
        (version_ids, not_ready_max_seconds))
    await drop_expired_not_ready(conn, not_ready_max_seconds, version_ids)


async def drop_expired_not_ready(conn: AsyncConnection, not_ready_max_seconds: int,
                                 version_ids: list[str] | None = None) -> None:
    """not_ready evaluations (of `version_ids`, or all) waiting longer than allowed are dropped."""
    await conn.execute(
        "DELETE FROM monitor_evaluations WHERE next_attempt_at IS NULL"
        " AND first_not_ready_at + make_interval(secs => %s) < now()"
        " AND (%s::text[] IS NULL OR version_id = ANY(%s::text[]))",
        (not_ready_max_seconds, version_ids, version_ids))


async def fold_not_current(conn: AsyncConnection, e: JournalEvent, settings: DeliverySettings) -> list[NewEvent]:
    version_id = e.payload.version_id
    await conn.execute("DELETE FROM monitor_evaluations WHERE version_id = %s", (version_id,))
    return await _withdraw(conn, "version_id = %s", version_id, VERSION_REPLACED, settings)


async def fold_withdrawn(conn: AsyncConnection, e: JournalEvent, settings: DeliverySettings) -> list[NewEvent]:
    record_id = e.payload.record_id
    # By the Record's Versions (their record.accepted events, journal_record_history), each then
    # by the table's key, which leads with the Version (schema/032): no index leads with record_id,
    # and the heap holds every evaluation that ended since its last vacuum, which a scan for
    # record_id would read.
    await conn.execute(
        "DELETE FROM monitor_evaluations WHERE version_id IN (SELECT j.version_id FROM journal j"
        " WHERE j.org_id = %s AND j.corpus_id = %s AND j.subject_id = %s AND j.kind = 'record.accepted'"
        " AND j.position < %s)", (e.org_id, e.corpus_id, record_id, e.position))
    return await _withdraw(conn, "record_id = %s", record_id, RECORD_WITHDRAWN, settings)


async def _withdraw(conn: AsyncConnection, where: str, value: str, reason: str,
                    settings: DeliverySettings) -> list[NewEvent]:
    """active -> withdrawn (terminal), each with its `match.withdrawn` change event and a pending
    Delivery whatever the Subscription's state (held while disabled or deleted)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"UPDATE matches SET state = 'withdrawn', withdrawn_reason = %s, withdrawn_at = now()"
        f" WHERE {where} AND state = 'active' RETURNING *", (reason, value))
    out: list[NewEvent] = []
    for m in await cur.fetchall():
        held = await notice_hold(conn, m["subscription_id"])
        delivery = await create_delivery(conn, _notice(m, MATCH_WITHDRAWN), settings, held)
        out.append(NewEvent(
            org_id=m["org_id"], corpus_id=m["corpus_id"], subject_type=MATCH_SUBJECT, subject_id=m["match_id"],
            version_id=m["version_id"],
            payload=MatchWithdrawn(match_id=m["match_id"], subscription_id=m["subscription_id"],
                                   subscription_version_id=m["subscription_version_id"], record_id=m["record_id"],
                                   version_id=m["version_id"], reason=reason, withdrawn_at=iso(m["withdrawn_at"]),
                                   delivery_id=delivery.delivery_id)))
    return out


def _notice(m: dict, event_type: str) -> Notice:
    return Notice(org_id=m["org_id"], corpus_id=m["corpus_id"], match_id=m["match_id"],
                  subscription_id=m["subscription_id"], subscription_version_id=m["subscription_version_id"],
                  saved_query_id=m["saved_query_id"], saved_query_version_id=m["saved_query_version_id"],
                  record_id=m["record_id"], version_id=m["version_id"], destination_id=m["destination_id"],
                  event_type=event_type, owner=m["owner"])


# ------------------------------------------------------------------------- settling answers


# Settling reads which evaluations are still pending without locking them: only the `monitor`
# writes them, as one instance (its advisory lock) on one connection, so no row can change between
# this read and the settling writes of the same transaction. Locking them (FOR UPDATE) wrote to
# every row, a thousand a Version (docs/decisions.md, "Evaluation and Matches").


async def is_pending(conn: AsyncConnection, subscription_version_id: str, version_id: str) -> bool:
    """Whether the evaluation is still pending (not settled or dropped)."""
    cur = await conn.execute("SELECT 1 FROM monitor_evaluations WHERE subscription_version_id = %s"
                             " AND version_id = %s", (subscription_version_id, version_id))
    return await cur.fetchone() is not None


async def pending_pairs(conn: AsyncConnection, keys: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Those of the (subscription_version_id, version_id) pairs still pending, in one statement that
    names their few Versions instead of every pair."""
    if not keys:
        return set()
    cur = await conn.execute(
        "SELECT subscription_version_id, version_id FROM monitor_evaluations"
        " WHERE version_id = ANY(%s)", (sorted({k[1] for k in keys}),))
    return {(r[0], r[1]) for r in await cur.fetchall()} & set(keys)


async def settle_no_match_many(conn: AsyncConnection, rows: list[dict]) -> None:
    """settle_no_match for many evaluations (of any Versions) at once: a decision per row, its
    Subscription's last_evaluated_at, in two statements whatever the number of rows."""
    if not rows:
        return
    await _decided_many(conn, rows)


async def _decided_many(conn: AsyncConnection, rows: list[dict]) -> None:
    await _ended(conn, rows)
    await conn.execute(
        "INSERT INTO monitor_subscription_status AS s (subscription_id, last_evaluated_at, last_error)"
        " SELECT unnest(%b::text[]), now(), NULL::jsonb"
        " ON CONFLICT (subscription_id) DO UPDATE SET last_evaluated_at = now()"
        # To the second: a Subscription decided for every Version of a burst is rewritten once a
        # second, not once per Version (a thousand Subscriptions x each Version otherwise).
        " WHERE s.last_evaluated_at IS NULL OR s.last_evaluated_at < now() - interval '1 second'",
        (sorted({r["subscription_id"] for r in rows}),))


async def settle_decided_many(conn: AsyncConnection, no_match: list[dict], match: list[tuple[dict, dict]],
                              settings: DeliverySettings) -> list[NewEvent]:
    """A step's no_match and match decisions, set-based: a fixed number of
    statements whatever the number of decisions. `match` pairs a pending row (with its Subscription
    Version's saved_query_id, saved_query_version_id, destination_id, owner) with its evidence.
    A Subscription disabled or deleted meanwhile commits no Match: its evaluation is dropped."""
    holds = await notice_holds(conn, [r["subscription_id"] for r, _ in match]) if match else {}
    dropped = [r for r, _ in match if holds[r["subscription_id"]] is not None]
    matched = [(r, evidence) for r, evidence in match if holds[r["subscription_id"]] is None]
    if dropped:
        await _ended(conn, dropped)
    decided = no_match + [r for r, _ in matched]
    if decided:
        await _decided_many(conn, decided)
    if not matched:
        return []
    names = ("org_id", "corpus_id", "subscription_id", "subscription_version_id", "saved_query_id",
             "saved_query_version_id", "record_id", "version_id", "destination_id", "owner")
    columns = [[new_id("mat") for _ in matched]] + [[r[n] for r, _ in matched] for n in names] \
        + [[msgspec.json.encode(evidence).decode("utf-8") for _, evidence in matched]]
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "INSERT INTO matches (match_id, org_id, corpus_id, subscription_id, subscription_version_id, saved_query_id,"
        " saved_query_version_id, record_id, version_id, destination_id, owner, evidence, state, created_at)"
        " SELECT u.*, 'active', now() FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
        "   %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::jsonb[]) AS u"
        " ON CONFLICT (subscription_version_id, version_id) DO NOTHING RETURNING *",  # one per pair
        columns)
    created = sorted(await cur.fetchall(), key=lambda m: (m["version_id"], m["subscription_version_id"]))
    await create_deliveries_many(conn, [(_notice(m, MATCH_CREATED), None) for m in created], settings)
    return [NewEvent(
        org_id=m["org_id"], corpus_id=m["corpus_id"], subject_type=MATCH_SUBJECT, subject_id=m["match_id"],
        version_id=m["version_id"],
        payload=MatchCreated(match_id=m["match_id"], subscription_id=m["subscription_id"],
                             subscription_version_id=m["subscription_version_id"], record_id=m["record_id"],
                             version_id=m["version_id"], created_at=iso(m["created_at"]))) for m in created]


async def _ended(conn: AsyncConnection, rows: list[dict]) -> None:
    """These evaluations are decided, failed or dropped: they leave the table (schema/031)."""
    await conn.execute(
        "DELETE FROM monitor_evaluations e USING unnest(%b::text[], %b::text[]) AS k(sv, v)"
        " WHERE e.subscription_version_id = k.sv AND e.version_id = k.v",
        ([r["subscription_version_id"] for r in rows], [r["version_id"] for r in rows]))


async def settle_failed(conn: AsyncConnection, row: dict, code: str) -> None:
    """A terminal error (`evaluator_failed`) or an invalid answer (`evaluator_invalid_output`): no Match,
    and the Subscription's `evaluation.last_error` until a later failure replaces it."""
    await _ended(conn, [row])
    await conn.execute(
        "INSERT INTO monitor_subscription_status AS s (subscription_id, last_evaluated_at, last_error)"
        " VALUES (%s, now(), %s) ON CONFLICT (subscription_id) DO UPDATE SET last_evaluated_at = now(),"
        " last_error = EXCLUDED.last_error",
        (row["subscription_id"], Jsonb({"code": code, "at": iso(await database_now(conn))})))


async def settle_not_ready(conn: AsyncConnection, row: dict, not_ready_max_seconds: int) -> None:
    """Kept pending until the Version's next trigger; dropped once waiting longer than allowed."""
    await conn.execute(
        "UPDATE monitor_evaluations SET attempts = attempts + 1, next_attempt_at = NULL,"
        " first_not_ready_at = coalesce(first_not_ready_at, now())"
        " WHERE subscription_version_id = %s AND version_id = %s",
        (row["subscription_version_id"], row["version_id"]))
    await drop_expired_not_ready(conn, not_ready_max_seconds, [row["version_id"]])


async def settle_retry(conn: AsyncConnection, row: dict, delay_seconds: float, cause: str) -> None:
    await conn.execute(
        "UPDATE monitor_evaluations SET attempts = attempts + 1, last_error = %s,"
        " next_attempt_at = now() + make_interval(secs => %s)"
        " WHERE subscription_version_id = %s AND version_id = %s",
        (cause[:1024], delay_seconds, row["subscription_version_id"], row["version_id"]))
