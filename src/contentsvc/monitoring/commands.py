"""The Saved Query and Subscription commands (part 2 "Saved queries and subscriptions" rules 1-9,
"States and transitions" > Subscription and Saved Query; decisions-part2 "Monitoring").

Each runs one journal transaction: it claims its idempotency key (a replay answers what the key
produced; a changed request is 409 idempotency_conflict), takes the resource's lock (an advisory
transaction lock per Saved Query or Subscription, so two writers of one resource decide on what
the other committed), checks, then folds and appends one `*.committed` fact plus the public
change events, once in each Corpus the rule names. A refusal rolls the whole transaction back,
the key's claim with it.

A Subscription pins the current Version of a Saved Query it holds that query's lock for, so a
Saved Query cannot get a new Version or be deleted under a Subscription being created on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.config import Settings
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import utc_now
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.ids import new_id
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.monitoring import deliveries
from contentsvc.monitoring import events as me
from contentsvc.monitoring import views
from contentsvc.monitoring.evaluators import installed_evaluator
from contentsvc.monitoring.shapes import (
    RenameRequest,
    SavedQueryCreate,
    SavedQueryVersionCreate,
    SubscriptionCreate,
    SubscriptionVersionCreate,
    check_against_evaluator,
    check_corpus_ids,
    check_expression,
    check_owner,
)
from contentsvc.monitoring.views import SavedQueryHead, SubscriptionHead
from contentsvc.readmodel.corpora import existing_corpora
from contentsvc.readmodel.fold import fold

# Idempotency families (decisions-part2 names `saved_query`; the others follow it). Keys are per
# Organization; the path's id is part of the request digest, so one key on two resources conflicts.
SAVED_QUERY = "saved_query"
SAVED_QUERY_VERSION = "saved_query_version"
SAVED_QUERY_RENAME = "saved_query_rename"
SUBSCRIPTION = "subscription"
SUBSCRIPTION_VERSION = "subscription_version"
SUBSCRIPTION_RENAME = "subscription_rename"


# ---------------------------------------------------------------- shared steps


async def _lock(conn: AsyncConnection, kind: str, resource_id: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{kind}:{resource_id}",))


async def _require_corpora(conn: AsyncConnection, p: Principal, corpus_ids: list[str]) -> None:
    """decisions-part2 "Saved queries": a Corpus outside the key's scope is 403 forbidden
    (`/corpus_ids/N`); one in scope but absent is 404 not_found."""
    for n, corpus_id in enumerate(corpus_ids):
        if not p.covers(corpus_id):
            raise ApiError(403, "forbidden", f"The API key's Corpus scope does not include {corpus_id!r}.",
                           field=f"/corpus_ids/{n}")
    existing = await existing_corpora(conn, p.org_id, corpus_ids)
    missing = [c for c in corpus_ids if c not in existing]
    if missing:
        raise not_found(f"corpus {missing[0]!r}")


def _notices(p: Principal, payload: Any, subject_type: str, subject_id: str, corpus_ids: list[str]) -> list[NewEvent]:
    """One public change event in each Corpus (decisions-part2: committed once in each Corpus named)."""
    return [NewEvent(org_id=p.org_id, corpus_id=c, subject_type=subject_type, subject_id=subject_id, payload=payload)
            for c in sorted(set(corpus_ids))]


async def _commit(conn: AsyncConnection, events: list[NewEvent]) -> None:
    await fold(conn, events)  # the rows the answer reads, at once (the projector folds them again)
    await append(conn, events)


def _union(*scopes: list[str]) -> list[str]:
    return sorted({c for scope in scopes for c in scope})


# ---------------------------------------------------------------- Saved Queries


def _saved_query_fact(head: SavedQueryHead, now: str, version: me.SavedQueryVersionFact | None = None,
                      **changes: Any) -> me.SavedQueryCommitted:
    head = dataclasses.replace(head, **changes)
    return me.SavedQueryCommitted(
        saved_query_id=head.saved_query_id, revision=head.revision + 1, name=head.name,
        current_version_id=head.current_version_id, corpus_ids=head.corpus_ids, deleted=head.deleted,
        created_at=head.created_at, updated_at=now, version=version if version is not None else msgspec.UNSET)


def _saved_query_event(p: Principal, fact: me.SavedQueryCommitted) -> NewEvent:
    return NewEvent(org_id=p.org_id, subject_type=me.SAVED_QUERY_SUBJECT, subject_id=fact.saved_query_id,
                    payload=fact)


async def _locked_saved_query(conn: AsyncConnection, p: Principal, saved_query_id: str) -> SavedQueryHead:
    await _lock(conn, me.SAVED_QUERY_SUBJECT, saved_query_id)
    head = await views.visible_saved_query(conn, p, saved_query_id)
    if head is None:
        raise not_found("saved query")
    return head


def _saved_query_deleted() -> ApiError:
    return ApiError(409, "saved_query_deleted", "The Saved Query is deleted.")


async def create_saved_query(conn: AsyncConnection, p: Principal, req: SavedQueryCreate) -> tuple[str, bool]:
    """rule 1: the definition and its first Version; evaluates nothing. Returns (id, replayed)."""
    check_corpus_ids(req.corpus_ids)
    check_expression(req.expression)
    saved_query_id, version_id, now = new_id("sq"), new_id("sqv"), utc_now()
    async with journal_transaction(conn):
        await _require_corpora(conn, p, req.corpus_ids)
        prior = await idempotency.claim_one(conn, p.org_id, SAVED_QUERY, req.idempotency_key, request_digest(req),
                                            201, "saved_query", saved_query_id)
        if prior is not None:
            return prior, True
        fact = me.SavedQueryCommitted(
            saved_query_id=saved_query_id, revision=1, name=req.name, current_version_id=version_id,
            corpus_ids=req.corpus_ids, deleted=False, created_at=now, updated_at=now,
            version=me.SavedQueryVersionFact(version_id=version_id, corpus_ids=req.corpus_ids,
                                             expression=req.expression, created_at=now))
        # decisions-part2: creation commits saved_query.updated in each Corpus of the scope.
        await _commit(conn, [_saved_query_event(p, fact),
                             *_notices(p, me.SavedQueryUpdated(saved_query_id=saved_query_id),
                                       me.SAVED_QUERY_SUBJECT, saved_query_id, req.corpus_ids)])
    return saved_query_id, False


async def create_saved_query_version(conn: AsyncConnection, p: Principal, saved_query_id: str,
                                     req: SavedQueryVersionCreate) -> tuple[str, bool]:
    """rule 2: a new current Version; Subscriptions keep the Version they pin. Returns (version id, replayed)."""
    if req.corpus_ids is not None:
        check_corpus_ids(req.corpus_ids)
    check_expression(req.expression)
    version_id, now = new_id("sqv"), utc_now()
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, SAVED_QUERY_VERSION, req.idempotency_key,
                                            request_digest(req, saved_query_id=saved_query_id), 201,
                                            "saved_query_version", version_id)
        if prior is not None:
            return prior, True
        head = await _locked_saved_query(conn, p, saved_query_id)  # the current scope granted, else 404
        if head.deleted:
            raise _saved_query_deleted()  # part 2 Saved Query states: deletion blocks new Versions
        corpus_ids = req.corpus_ids if req.corpus_ids is not None else head.corpus_ids
        await _require_corpora(conn, p, corpus_ids)  # rule 2: the key grants the new definition's Corpora too
        fact = _saved_query_fact(
            head, now, me.SavedQueryVersionFact(version_id=version_id, corpus_ids=corpus_ids,
                                                expression=req.expression, created_at=now),
            current_version_id=version_id, corpus_ids=corpus_ids)
        # rule 2: saved_query.updated in every Corpus of the previous and new scope.
        await _commit(conn, [_saved_query_event(p, fact),
                             *_notices(p, me.SavedQueryUpdated(saved_query_id=saved_query_id),
                                       me.SAVED_QUERY_SUBJECT, saved_query_id, _union(head.corpus_ids, corpus_ids))])
    return version_id, False


async def rename_saved_query(conn: AsyncConnection, p: Principal, saved_query_id: str, req: RenameRequest) -> None:
    """rule 4: only the display name; saved_query.renamed in each Corpus of the current Version, only
    for a new name; a deleted query is 409 saved_query_deleted."""
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, SAVED_QUERY_RENAME, req.idempotency_key,
                                            request_digest(req, saved_query_id=saved_query_id), 200, "saved_query",
                                            saved_query_id)
        if prior is not None:
            return
        head = await _locked_saved_query(conn, p, saved_query_id)
        if head.deleted:
            raise _saved_query_deleted()
        if req.name == head.name:
            return
        fact = _saved_query_fact(head, utc_now(), name=req.name)
        await _commit(conn, [_saved_query_event(p, fact),
                             *_notices(p, me.SavedQueryRenamed(saved_query_id=saved_query_id),
                                       me.SAVED_QUERY_SUBJECT, saved_query_id, head.corpus_ids)])


async def delete_saved_query(conn: AsyncConnection, p: Principal, saved_query_id: str) -> None:
    """part 2 Saved Query states and rule 4: allowed only while no non-deleted Subscription belongs
    to it (409 saved_query_in_use); saved_query.deleted per Corpus; a repeat commits nothing."""
    async with journal_transaction(conn):
        head = await _locked_saved_query(conn, p, saved_query_id)
        if head.deleted:
            return
        if await views.has_live_subscription(conn, saved_query_id):
            raise ApiError(409, "saved_query_in_use", "A Subscription that is not deleted belongs to this Saved "
                                                      "Query; delete it first.")
        fact = _saved_query_fact(head, utc_now(), deleted=True)
        await _commit(conn, [_saved_query_event(p, fact),
                             *_notices(p, me.SavedQueryDeleted(saved_query_id=saved_query_id),
                                       me.SAVED_QUERY_SUBJECT, saved_query_id, head.corpus_ids)])


# ---------------------------------------------------------------- Subscriptions: the pin


@dataclasses.dataclass(frozen=True)
class Pin:
    saved_query_id: str
    saved_query_version_id: str
    corpus_ids: list[str]


def _unknown_saved_query(message: str = "No current Version of a Saved Query this key may read has this id.") -> ApiError:
    return ApiError(422, "unknown_saved_query", message, field="/saved_query_version_id")


async def _pinned_query(conn: AsyncConnection, p: Principal, version_id: str, own_saved_query_id: str | None) -> tuple[Pin, dict]:
    """decisions-part2 "Subscriptions": the current Version of a non-deleted Saved Query whose Corpora
    the key all grants: unknown, out of scope or not current is 422 unknown_saved_query; a deleted
    query 409 saved_query_deleted. A new Subscription Version must pin its own Saved Query (rule 7)."""
    row = await views.saved_query_version_row(conn, p.org_id, version_id)
    if row is None:
        raise _unknown_saved_query()
    await _lock(conn, me.SAVED_QUERY_SUBJECT, row["saved_query_id"])
    head = await views.saved_query_head(conn, p.org_id, row["saved_query_id"])
    if head is None or not views.covers_all(p, head.corpus_ids) or not views.covers_all(p, row["corpus_ids"]):
        raise _unknown_saved_query()
    if own_saved_query_id is not None and head.saved_query_id != own_saved_query_id:
        raise _unknown_saved_query("A new Version must pin the current Version of the Subscription's own Saved Query.")
    if head.deleted:
        raise _saved_query_deleted()
    if head.current_version_id != version_id:
        raise _unknown_saved_query(f"{version_id!r} is not the current Version of its Saved Query "
                                   f"({head.current_version_id!r} is).")
    return Pin(head.saved_query_id, version_id, row["corpus_ids"]), row["expression"]


async def _checked_pin(conn: AsyncConnection, settings: Settings, p: Principal,
                       req: SubscriptionCreate | SubscriptionVersionCreate, own_saved_query_id: str | None) -> Pin:
    """rules 6 and 7, in this order: the Saved Query Version, the evaluator, the expression and
    configuration against its schemas, the destination."""
    pin, expression = await _pinned_query(conn, p, req.saved_query_version_id, own_saved_query_id)
    evaluator = await installed_evaluator(conn, req.evaluator.plugin_id, req.evaluator.version)
    check_against_evaluator(evaluator.expression_schema, evaluator.configuration_schema, expression,
                            req.evaluator.configuration)
    if req.destination_id not in settings.destinations:  # decisions-part2 "Destinations": the startup file's
        raise ApiError(422, "unknown_destination", f"No destination {req.destination_id!r} is configured.",
                       field="/destination_id")
    return pin


def _subscription_version(version_id: str, pin: Pin, req: SubscriptionCreate | SubscriptionVersionCreate,
                          now: str) -> me.SubscriptionVersionFact:
    evaluator = me.Evaluator(plugin_id=req.evaluator.plugin_id, version=req.evaluator.version,
                             configuration=req.evaluator.configuration)
    return me.SubscriptionVersionFact(version_id=version_id, saved_query_id=pin.saved_query_id,
                                      saved_query_version_id=pin.saved_query_version_id, evaluator=evaluator,
                                      destination_id=req.destination_id, corpus_ids=pin.corpus_ids, created_at=now,
                                      activated_at=now)


# ---------------------------------------------------------------- Subscriptions


def _subscription_fact(head: SubscriptionHead, now: str, version: me.SubscriptionVersionFact | None = None,
                       **changes: Any) -> me.SubscriptionCommitted:
    head = dataclasses.replace(head, **changes)
    return me.SubscriptionCommitted(
        subscription_id=head.subscription_id, revision=head.revision + 1, name=head.name,
        owner=head.owner if head.owner is not None else msgspec.UNSET, saved_query_id=head.saved_query_id,
        current_version_id=head.current_version_id, enabled=head.enabled, deleted=head.deleted,
        disabled_reason=head.disabled_reason if head.disabled_reason is not None else msgspec.UNSET,
        scope=head.scope, created_at=head.created_at, updated_at=now,
        version=version if version is not None else msgspec.UNSET)


def _subscription_event(p: Principal, fact: me.SubscriptionCommitted) -> NewEvent:
    return NewEvent(org_id=p.org_id, subject_type=me.SUBSCRIPTION_SUBJECT, subject_id=fact.subscription_id,
                    payload=fact)


async def _locked_subscription(conn: AsyncConnection, p: Principal, subscription_id: str) -> tuple[SubscriptionHead,
                                                                                                    list[str]]:
    """The Subscription (rule 8: every pinned Corpus granted, else 404) and its current Version's Corpora."""
    await _lock(conn, me.SUBSCRIPTION_SUBJECT, subscription_id)
    head = await views.visible_subscription(conn, p, subscription_id)
    if head is None:
        raise not_found("subscription")
    current = await views.subscription_version_row(conn, p.org_id, head.current_version_id)
    return head, current["corpus_ids"]


def _subscription_deleted() -> ApiError:
    return ApiError(409, "subscription_deleted", "The Subscription is deleted.")


async def create_subscription(conn: AsyncConnection, settings: Settings, p: Principal,
                              req: SubscriptionCreate) -> tuple[str, bool]:
    """rule 6: an enabled Subscription, its Version and activation boundary, atomically. A replay
    answers it as it is now (disabled since, it stays disabled). Returns (id, replayed)."""
    check_owner(req.owner)
    subscription_id, version_id, now = new_id("sub"), new_id("subv"), utc_now()
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, SUBSCRIPTION, req.idempotency_key, request_digest(req),
                                            201, "subscription", subscription_id)
        if prior is not None:
            return prior, True
        pin = await _checked_pin(conn, settings, p, req, None)
        fact = me.SubscriptionCommitted(
            subscription_id=subscription_id, revision=1, name=req.name,
            owner=req.owner if req.owner is not None else msgspec.UNSET, saved_query_id=pin.saved_query_id,
            current_version_id=version_id, enabled=True, deleted=False, scope=sorted(pin.corpus_ids),
            created_at=now, updated_at=now, version=_subscription_version(version_id, pin, req, now))
        # decisions-part2: creation commits subscription.updated in each Corpus of the pinned scope.
        await _commit(conn, [_subscription_event(p, fact),
                             *_notices(p, me.SubscriptionUpdated(subscription_id=subscription_id),
                                       me.SUBSCRIPTION_SUBJECT, subscription_id, pin.corpus_ids)])
    return subscription_id, False


async def create_subscription_version(conn: AsyncConnection, settings: Settings, p: Principal, subscription_id: str,
                                      req: SubscriptionVersionCreate) -> tuple[str, bool]:
    """rule 7: a new current Version from its commit; enabled state unchanged, nothing backfilled.
    Returns (version id, replayed)."""
    version_id, now = new_id("subv"), utc_now()
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, SUBSCRIPTION_VERSION, req.idempotency_key,
                                            request_digest(req, subscription_id=subscription_id), 201,
                                            "subscription_version", version_id)
        if prior is not None:
            return prior, True
        head, previous_scope = await _locked_subscription(conn, p, subscription_id)
        if head.deleted:
            raise _subscription_deleted()
        pin = await _checked_pin(conn, settings, p, req, head.saved_query_id)
        await _commit_version(conn, p, head, previous_scope, _subscription_version(version_id, pin, req, now), now)
    return version_id, False


async def _commit_version(conn: AsyncConnection, p: Principal, head: SubscriptionHead, previous_scope: list[str],
                          version: me.SubscriptionVersionFact, now: str) -> None:
    """rule 7's commit: the new current Version from this commit, enabled state unchanged, and
    subscription.updated in every Corpus of the previous and new scope."""
    fact = _subscription_fact(head, now, version, current_version_id=version.version_id,
                              scope=_union(head.scope, version.corpus_ids))
    await _commit(conn, [_subscription_event(p, fact),
                         *_notices(p, me.SubscriptionUpdated(subscription_id=head.subscription_id),
                                   me.SUBSCRIPTION_SUBJECT, head.subscription_id,
                                   _union(previous_scope, version.corpus_ids))])


async def repin_evaluator(conn: AsyncConnection, p: Principal, subscription_id: str, expected_version_id: str,
                          evaluator: me.Evaluator) -> str | None:
    """Evaluator migration's move (part 2 "Evaluator migration"): a new current Version with the same
    Saved Query Version, configuration and destination as `expected_version_id`, pinning `evaluator`,
    committed like any new Version (rule 7: it judges only later changes). The pinned Saved Query
    Version need not be current and the destination need not be configured any more: the
    Subscription keeps what it had. Returns the new Version's id, or None when the Subscription's
    current Version is no longer `expected_version_id` (or it is deleted): the caller's
    `subscription_changed`."""
    version_id, now = new_id("subv"), utc_now()
    async with journal_transaction(conn):
        head, previous_scope = await _locked_subscription(conn, p, subscription_id)
        if head.deleted or head.current_version_id != expected_version_id:
            return None
        current = await views.subscription_version_row(conn, p.org_id, expected_version_id)
        version = me.SubscriptionVersionFact(
            version_id=version_id, saved_query_id=current["saved_query_id"],
            saved_query_version_id=current["saved_query_version_id"], evaluator=evaluator,
            destination_id=current["destination_id"], corpus_ids=current["corpus_ids"], created_at=now,
            activated_at=now)
        await _commit_version(conn, p, head, previous_scope, version, now)
    return version_id


async def rename_subscription(conn: AsyncConnection, p: Principal, subscription_id: str, req: RenameRequest) -> None:
    """rule 9: subscription.renamed per Corpus of the current Version, only for a new name; 409
    subscription_deleted on a deleted one."""
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, SUBSCRIPTION_RENAME, req.idempotency_key,
                                            request_digest(req, subscription_id=subscription_id), 200,
                                            "subscription", subscription_id)
        if prior is not None:
            return
        head, scope = await _locked_subscription(conn, p, subscription_id)
        if head.deleted:
            raise _subscription_deleted()
        if req.name == head.name:
            return
        fact = _subscription_fact(head, utc_now(), name=req.name)
        await _commit(conn, [_subscription_event(p, fact),
                             *_notices(p, me.SubscriptionRenamed(subscription_id=subscription_id),
                                       me.SUBSCRIPTION_SUBJECT, subscription_id, scope)])


async def _lock_subscription_row(conn: AsyncConnection, subscription_id: str) -> None:
    """Waits for every transaction committing a notice for this Subscription (it reads the row FOR
    SHARE through deliveries.notice_hold) and keeps new ones out until this one commits, so the
    holds set or cleared below see every Delivery created before, and a notice committed after
    sees the new state."""
    await conn.execute("SELECT 1 FROM subscriptions WHERE subscription_id = %s FOR UPDATE", (subscription_id,))


async def set_enabled(conn: AsyncConnection, settings: Settings, p: Principal, subscription_id: str,
                      enabled: bool) -> None:
    """part 2 Subscription states: disable and enable commit subscription.updated only when they
    change the state; enabling a deleted one is 409 subscription_deleted (it stays disabled).
    decisions-part2 "Deliveries", in the same transaction: disable holds every pending Delivery
    `subscription_disabled`; enable releases them (due at once, or failed delivery_window_expired
    past their window), each move with its delivery.changed."""
    async with journal_transaction(conn):
        head, scope = await _locked_subscription(conn, p, subscription_id)
        if head.deleted:
            if enabled:
                raise _subscription_deleted()
            return  # already disabled, with reason subscription_deleted
        if head.enabled == enabled:
            return
        await _lock_subscription_row(conn, subscription_id)
        moved = (await deliveries.release_subscription(conn, subscription_id, settings.deliveries) if enabled
                 else await deliveries.hold_subscription(conn, subscription_id, deliveries.HELD_DISABLED))
        fact = _subscription_fact(head, utc_now(), enabled=enabled, disabled_reason=None if enabled else "disabled")
        await _commit(conn, [_subscription_event(p, fact),
                             *_notices(p, me.SubscriptionUpdated(subscription_id=subscription_id),
                                       me.SUBSCRIPTION_SUBJECT, subscription_id, scope),
                             *moved])


async def delete_subscription(conn: AsyncConnection, p: Principal, subscription_id: str) -> None:
    """part 2 Subscription states and rule 9: deleted, also disabled with reason subscription_deleted;
    subscription.deleted per Corpus; a repeat commits nothing. decisions-part2 "Deliveries": every
    pending Delivery is held `subscription_deleted`, never cleared, in the same transaction; a
    notice committed later (a `match.withdrawn`) is created held the same way (notice_hold), so it
    is committed but never attempted."""
    async with journal_transaction(conn):
        head, scope = await _locked_subscription(conn, p, subscription_id)
        if head.deleted:
            return
        await _lock_subscription_row(conn, subscription_id)
        moved = await deliveries.hold_subscription(conn, subscription_id, deliveries.HELD_DELETED)
        fact = _subscription_fact(head, utc_now(), deleted=True, enabled=False,
                                  disabled_reason="subscription_deleted")
        await _commit(conn, [_subscription_event(p, fact),
                             *_notices(p, me.SubscriptionDeleted(subscription_id=subscription_id),
                                       me.SUBSCRIPTION_SUBJECT, subscription_id, scope),
                             *moved])


__all__ = ["create_saved_query", "create_saved_query_version", "rename_saved_query", "delete_saved_query",
           "create_subscription", "create_subscription_version", "repin_evaluator", "rename_subscription", "set_enabled",
           "delete_subscription"]
