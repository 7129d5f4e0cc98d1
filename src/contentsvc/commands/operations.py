"""Commands of the Operation family: configureRetrieval, rebuildCorpusProjection,
cancelOperation, rerunOperation (part 1 rules 10, 11, 15, 17).

Each appends an `operation.changed` event (the acceptance carries the
request the lexical projector acts on) and folds it inline, so the
Operation is readable the instant the answer leaves. The work itself
happens in the lexical projector (projectors/projections.py); HTTP never
waits for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.domain import operations as ops
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.domain.models import ActionRequest, ConfigUpdate, KeyedActionRequest
from contentsvc.domain.retrieval import effective_retrieval
from contentsvc.journal import events as ev
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.readmodel.corpora import corpus_or_404
from contentsvc.readmodel.fold import fold


async def _accept(conn: AsyncConnection, p: Principal, corpus_id: str, family: str, key: str, digest: bytes,
                  request: ev.OperationRequest, previous_operation_id: str | None = None,
                  still_eligible: Callable[[], Awaitable[None]] | None = None) -> tuple[str, bool]:
    """Claim the key and append a new queued Operation; (operation_id, replayed). A replay answers
    what the key produced; only a new request is held to `still_eligible` (which raises, and the
    claim rolls back with the transaction)."""
    operation_id = ops.new_operation_id()
    prior = await idempotency.claim_one(conn, p.org_id, family, key, digest, 202, "operation", operation_id)
    if prior is not None:
        return prior, True
    if still_eligible is not None:
        await still_eligible()
    operation = {"kind": request.kind, "state": "queued", "corpus_id": corpus_id,
                 "counters": {"versions_in_scope": 0, "versions_done": 0}, "errors": []}
    if previous_operation_id is not None:
        operation["previous_operation_id"] = previous_operation_id
    event = ops.changed(p.org_id, corpus_id, operation_id, operation, request)
    await fold(conn, [event])
    await append(conn, [event])
    return operation_id, False


async def _configurations_in_order(conn: AsyncConnection, org_id: str, corpus_id: str) -> None:
    """Configuration acceptances of one Corpus take turns, so that what a rerun checks (the one
    accepted last) is still so when it appends. Taken before the journal lock, as every appender does."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"retrieval:{org_id}:{corpus_id}",))


async def _last_accepted_configuration(conn: AsyncConnection, org_id: str, corpus_id: str) -> dict | None:
    """The retrieval configuration accepted last for the Corpus (journal order), None when none was."""
    cur = await conn.execute(
        "SELECT payload->'request'->'retrieval' FROM journal WHERE org_id = %s AND corpus_id = %s"
        " AND kind = %s AND payload ? 'request' AND payload->'request'->>'kind' = %s"
        " ORDER BY position DESC LIMIT 1", (org_id, corpus_id, ev.OPERATION_CHANGED, ops.RETRIEVAL_CONFIGURATION))
    row = await cur.fetchone()
    return None if row is None else row[0]


async def configure_retrieval(conn: AsyncConnection, p: Principal, corpus_id: str,
                              req: ConfigUpdate) -> tuple[str, bool]:
    retrieval = effective_retrieval(req.retrieval)
    async with journal_transaction(conn):
        await corpus_or_404(conn, p, corpus_id)
        await _configurations_in_order(conn, p.org_id, corpus_id)
        return await _accept(conn, p, corpus_id, f"retrieval:{corpus_id}", req.idempotency_key,
                             request_digest(req, corpus_id=corpus_id),
                             ev.OperationRequest(kind=ops.RETRIEVAL_CONFIGURATION, retrieval=retrieval))


async def rebuild_corpus(conn: AsyncConnection, p: Principal, corpus_id: str,
                         req: KeyedActionRequest) -> tuple[str, bool]:
    async with journal_transaction(conn):
        await corpus_or_404(conn, p, corpus_id)
        return await _accept(conn, p, corpus_id, f"rebuild:{corpus_id}", req.idempotency_key,
                             request_digest(req, corpus_id=corpus_id),
                             ev.OperationRequest(kind=ops.PROJECTION_REBUILD))


async def find_operation(conn: AsyncConnection, p: Principal, operation_id: str, *, for_update: bool = False):
    """(corpus_id, public document, request) of an Operation the key may reach: another
    Organization's, or one on a Corpus outside the key's scope, is 404."""
    cur = await conn.execute(
        "SELECT corpus_id, doc, request FROM operations WHERE operation_id = %s AND org_id = %s"
        + (" FOR UPDATE" if for_update else ""), (operation_id, p.org_id))
    row = await cur.fetchone()
    if row is None or (row[0] is not None and not p.covers(row[0])):
        raise not_found("operation")
    return row


async def cancel_operation(conn: AsyncConnection, p: Principal, operation_id: str, req: ActionRequest | None) -> None:
    """Idempotent: a terminal or already canceling Operation is left as it is."""
    async with journal_transaction(conn):
        corpus_id, doc, _ = await find_operation(conn, p, operation_id, for_update=True)
        if doc["state"] in ops.TERMINAL or doc["state"] == "cancel_requested":
            return
        event = ops.changed(p.org_id, corpus_id, operation_id, {"state": "cancel_requested"})
        await fold(conn, [event])
        await append(conn, [event])


async def rerun_operation(conn: AsyncConnection, p: Principal, operation_id: str,
                          req: KeyedActionRequest) -> tuple[str, bool]:
    """A terminal Operation runs again as a new one linked to it; the same key replays it.

    Rule 11: the key's current scope (find_operation) and the original command's eligibility are
    checked again: the key needs what that command needed, the Corpus must still be there, and a
    retrieval configuration is rerun only while no different one was accepted after it (409
    retrieval_configuration_superseded: a rerun never reverts a newer configuration)."""
    async with journal_transaction(conn):
        corpus_id, doc, request = await find_operation(conn, p, operation_id)
        p.require(*ops.STARTED_WITH.get(request.get("kind"), ()))
        if doc["state"] not in ops.TERMINAL:  # terminal is forever: a replay of an accepted rerun passes too
            raise ApiError(409, "operation_not_terminal",
                           f"Operation {operation_id} is {doc['state']}; only a finished Operation can be rerun.")
        await corpus_or_404(conn, p, corpus_id)

        async def not_superseded() -> None:
            if await _last_accepted_configuration(conn, p.org_id, corpus_id) != request.get("retrieval"):
                raise ApiError(409, ops.CONFIGURATION_SUPERSEDED, ops.RERUN_SUPERSEDED_MESSAGE)

        reconfigures = request.get("kind") == ops.RETRIEVAL_CONFIGURATION
        if reconfigures:
            await _configurations_in_order(conn, p.org_id, corpus_id)
        return await _accept(conn, p, corpus_id, f"rerun:{operation_id}", req.idempotency_key,
                             request_digest(req, operation_id=operation_id),
                             msgspec.convert(request, ev.OperationRequest),  # the read model keeps it as accepted
                             previous_operation_id=operation_id,
                             still_eligible=not_superseded if reconfigures else None)
