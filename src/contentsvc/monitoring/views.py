"""Saved Queries and Subscriptions on the read side: the fold of their `*.committed` events into
the read tables (schema/018), and the reads the routes and commands make.

The fold is part of the read-model fold (readmodel/fold.py calls `fold_monitoring`): the commands
run it inline, in the transaction that appends the events, so the answer's rows are readable at
once, and the readmodel projector runs it again over the journal (and a replay from position 0
rebuilds the tables). A head row is set only by an event of a higher `revision` than the one it
holds, so folding an event twice, or late, leaves it as the newest event set it. Versions are
insert-if-absent. The projector, which knows positions, also records each Subscription Version's
activation position.

Visibility (part 2 rules 3 and 8): a Saved Query is read with grants on its current Version's
Corpora (and, for an earlier Version, that Version's too); a Subscription with grants on every
Corpus any of its Versions pinned. Anything else reads as absent (404), like an unknown id.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from contentsvc.auth.principal import Principal
from contentsvc.domain.clock import iso
from contentsvc.monitoring import events as me
from contentsvc.monitoring.shapes import (
    EvaluationView,
    EvaluatorView,
    SavedQuery,
    SavedQueryVersion,
    Subscription,
    SubscriptionVersion,
)

# ---------------------------------------------------------------- the fold

_SAVED_QUERY = """
INSERT INTO saved_queries AS q (saved_query_id, org_id, revision, name, current_version_id, corpus_ids, deleted,
                                created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (saved_query_id) DO UPDATE SET
    revision = EXCLUDED.revision, name = EXCLUDED.name, current_version_id = EXCLUDED.current_version_id,
    corpus_ids = EXCLUDED.corpus_ids, deleted = EXCLUDED.deleted, updated_at = EXCLUDED.updated_at
WHERE q.revision < EXCLUDED.revision
"""
_SAVED_QUERY_VERSION = """
INSERT INTO saved_query_versions (version_id, saved_query_id, org_id, corpus_ids, expression, created_at)
VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
"""
_SUBSCRIPTION = """
INSERT INTO subscriptions AS s (subscription_id, org_id, revision, name, owner, saved_query_id, current_version_id,
                                enabled, deleted, disabled_reason, scope, created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (subscription_id) DO UPDATE SET
    revision = EXCLUDED.revision, name = EXCLUDED.name, current_version_id = EXCLUDED.current_version_id,
    enabled = EXCLUDED.enabled, deleted = EXCLUDED.deleted, disabled_reason = EXCLUDED.disabled_reason,
    scope = EXCLUDED.scope, updated_at = EXCLUDED.updated_at
WHERE s.revision < EXCLUDED.revision
"""
_SUBSCRIPTION_VERSION = """
INSERT INTO subscription_versions AS v (version_id, subscription_id, org_id, saved_query_id, saved_query_version_id,
                                        evaluator, destination_id, owner, corpus_ids, created_at, activated_at,
                                        activation_position)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (version_id) DO UPDATE SET activation_position = EXCLUDED.activation_position
WHERE v.activation_position IS NULL AND EXCLUDED.activation_position IS NOT NULL
"""

FOLDED_KINDS = frozenset({me.SAVED_QUERY_COMMITTED, me.SUBSCRIPTION_COMMITTED})


def _unset_none(value):
    return None if value is msgspec.UNSET else value


async def fold_monitoring(conn: AsyncConnection, events: list) -> None:
    """Apply `*.committed` events (journal events, or new ones before their append) to the read tables."""
    for e in events:
        if e.kind not in FOLDED_KINDS:
            continue
        p = e.payload
        if isinstance(p, me.SavedQueryCommitted):
            await conn.execute(_SAVED_QUERY, (p.saved_query_id, e.org_id, p.revision, p.name, p.current_version_id,
                                              p.corpus_ids, p.deleted, p.created_at, p.updated_at))
            if p.version is not msgspec.UNSET:
                v = p.version
                await conn.execute(_SAVED_QUERY_VERSION, (v.version_id, p.saved_query_id, e.org_id, v.corpus_ids,
                                                          Jsonb(v.expression), v.created_at))
        elif isinstance(p, me.SubscriptionCommitted):
            await conn.execute(_SUBSCRIPTION, (p.subscription_id, e.org_id, p.revision, p.name, _unset_none(p.owner),
                                               p.saved_query_id, p.current_version_id, p.enabled, p.deleted,
                                               _unset_none(p.disabled_reason), p.scope, p.created_at, p.updated_at))
            if p.version is not msgspec.UNSET:
                v = p.version
                position = getattr(e, "position", None)  # None before the append draws it
                await conn.execute(_SUBSCRIPTION_VERSION, (
                    v.version_id, p.subscription_id, e.org_id, v.saved_query_id, v.saved_query_version_id,
                    Jsonb(msgspec.to_builtins(v.evaluator)), v.destination_id, _unset_none(p.owner), v.corpus_ids,
                    v.created_at, v.activated_at, position))


# ---------------------------------------------------------------- heads, as the commands use them


@dataclass(frozen=True)
class SavedQueryHead:
    saved_query_id: str
    revision: int
    name: str
    current_version_id: str
    corpus_ids: list[str]
    deleted: bool
    created_at: str
    updated_at: str

    def view(self) -> SavedQuery:
        return SavedQuery(saved_query_id=self.saved_query_id, name=self.name, corpus_ids=self.corpus_ids,
                          current_version_id=self.current_version_id, deleted=self.deleted,
                          created_at=self.created_at, updated_at=self.updated_at)


@dataclass(frozen=True)
class SubscriptionHead:
    subscription_id: str
    revision: int
    name: str
    owner: str | None
    saved_query_id: str
    current_version_id: str
    enabled: bool
    deleted: bool
    disabled_reason: str | None
    scope: list[str]
    created_at: str
    updated_at: str
    # What the `monitor` worker reports (monitoring/matches.py): evaluations waiting, the last
    # settled one, the last terminal failure.
    pending: int = 0
    last_evaluated_at: str | None = None
    last_error: dict | None = None

    def view(self) -> Subscription:
        return Subscription(subscription_id=self.subscription_id, name=self.name, owner=self.owner,
                            saved_query_id=self.saved_query_id, current_version_id=self.current_version_id,
                            enabled=self.enabled, deleted=self.deleted, disabled_reason=self.disabled_reason,
                            created_at=self.created_at, updated_at=self.updated_at,
                            evaluation=EvaluationView(pending=self.pending,
                                                      last_evaluated_at=self.last_evaluated_at,
                                                      last_error=self.last_error))


def _timestamps(row: dict) -> dict:
    out = {**row, "created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
    if out.get("last_evaluated_at") is not None:
        out["last_evaluated_at"] = iso(out["last_evaluated_at"])
    return out


async def saved_query_head(conn: AsyncConnection, org_id: str, saved_query_id: str) -> SavedQueryHead | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT saved_query_id, revision, name, current_version_id, corpus_ids, deleted, created_at,"
                      " updated_at FROM saved_queries WHERE org_id = %s AND saved_query_id = %s",
                      (org_id, saved_query_id))
    row = await cur.fetchone()
    return None if row is None else SavedQueryHead(**_timestamps(row))


_SUBSCRIPTION_COLUMNS = """subscription_id, revision, name, owner, saved_query_id, current_version_id, enabled,
    deleted, disabled_reason, scope, created_at, updated_at,
    (SELECT count(*) FROM monitor_evaluations e
       WHERE e.subscription_id = subscriptions.subscription_id)::int AS pending,
    (SELECT st.last_evaluated_at FROM monitor_subscription_status st
       WHERE st.subscription_id = subscriptions.subscription_id) AS last_evaluated_at,
    (SELECT st.last_error FROM monitor_subscription_status st
       WHERE st.subscription_id = subscriptions.subscription_id) AS last_error"""


async def subscription_head(conn: AsyncConnection, org_id: str, subscription_id: str) -> SubscriptionHead | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT {_SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE org_id = %s AND subscription_id = %s",
                      (org_id, subscription_id))
    row = await cur.fetchone()
    return None if row is None else SubscriptionHead(**_timestamps(row))


async def saved_query_version_row(conn: AsyncConnection, org_id: str, version_id: str) -> dict | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT version_id, saved_query_id, corpus_ids, expression, created_at FROM saved_query_versions"
                      " WHERE org_id = %s AND version_id = %s", (org_id, version_id))
    return await cur.fetchone()


async def subscription_version_row(conn: AsyncConnection, org_id: str, version_id: str) -> dict | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT version_id, subscription_id, saved_query_id, saved_query_version_id, evaluator,"
                      " destination_id, owner, corpus_ids, created_at, activated_at FROM subscription_versions"
                      " WHERE org_id = %s AND version_id = %s", (org_id, version_id))
    return await cur.fetchone()


async def has_live_subscription(conn: AsyncConnection, saved_query_id: str) -> bool:
    cur = await conn.execute("SELECT 1 FROM subscriptions WHERE saved_query_id = %s AND NOT deleted LIMIT 1",
                             (saved_query_id,))
    return await cur.fetchone() is not None


# ---------------------------------------------------------------- reads under the key's scope


def covers_all(p: Principal, corpus_ids: list[str]) -> bool:
    return all(p.covers(c) for c in corpus_ids)


async def visible_saved_query(conn: AsyncConnection, p: Principal, saved_query_id: str) -> SavedQueryHead | None:
    """rule 3: the query's current Version's Corpora all granted, else absent."""
    head = await saved_query_head(conn, p.org_id, saved_query_id)
    return head if head is not None and covers_all(p, head.corpus_ids) else None


def saved_query_version_view(row: dict) -> SavedQueryVersion:
    return SavedQueryVersion(version_id=row["version_id"], saved_query_id=row["saved_query_id"],
                             corpus_ids=row["corpus_ids"], expression=row["expression"],
                             created_at=iso(row["created_at"]))


async def visible_saved_query_version(conn: AsyncConnection, p: Principal, saved_query_id: str,
                                      version_id: str) -> SavedQueryVersion | None:
    """rule 3: grants on the current Version's Corpora and on that Version's; deleted queries' stay readable."""
    head = await visible_saved_query(conn, p, saved_query_id)
    if head is None:
        return None
    row = await saved_query_version_row(conn, p.org_id, version_id)
    if row is None or row["saved_query_id"] != saved_query_id or not covers_all(p, row["corpus_ids"]):
        return None
    return saved_query_version_view(row)


async def visible_subscription(conn: AsyncConnection, p: Principal, subscription_id: str) -> SubscriptionHead | None:
    """rule 8: every Corpus any of its Versions pinned granted, else absent."""
    head = await subscription_head(conn, p.org_id, subscription_id)
    return head if head is not None and covers_all(p, head.scope) else None


def subscription_version_view(row: dict) -> SubscriptionVersion:
    evaluator = row["evaluator"]
    return SubscriptionVersion(
        subscription_id=row["subscription_id"], version_id=row["version_id"], saved_query_id=row["saved_query_id"],
        saved_query_version_id=row["saved_query_version_id"],
        evaluator=EvaluatorView(plugin_id=evaluator["plugin_id"], version=evaluator["version"],
                                configuration=evaluator["configuration"]),
        destination_id=row["destination_id"], owner=row["owner"], created_at=iso(row["created_at"]),
        activated_at=iso(row["activated_at"]))


async def visible_subscription_version(conn: AsyncConnection, p: Principal, subscription_id: str,
                                       version_id: str) -> SubscriptionVersion | None:
    if await visible_subscription(conn, p, subscription_id) is None:
        return None
    row = await subscription_version_row(conn, p.org_id, version_id)
    if row is None or row["subscription_id"] != subscription_id:
        return None
    return subscription_version_view(row)


async def active_subscriptions(conn: AsyncConnection, p: Principal, owner: str | None, global_only: bool,
                               after: str | None, limit: int) -> list[Subscription]:
    """rule 5: enabled, not deleted, of one owner (or the global ones), in id order, only those whose
    pinned Corpora the key all grants."""
    scope = None if p.corpora is None else sorted(p.corpora)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"SELECT {_SUBSCRIPTION_COLUMNS} FROM subscriptions"
        " WHERE org_id = %s AND enabled AND NOT deleted AND subscription_id > %s"
        "   AND (%s::text IS NULL OR owner = %s::text) AND (NOT %s OR owner IS NULL)"
        "   AND (%b::text[] IS NULL OR scope <@ %b::text[])"
        " ORDER BY subscription_id LIMIT %s",
        (p.org_id, after or "", owner, owner, global_only, scope, scope, limit))
    return [SubscriptionHead(**_timestamps(row)).view() for row in await cur.fetchall()]
