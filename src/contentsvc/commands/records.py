"""Record commands: ingest and withdraw, one or a batch, in one transaction.

Each handler writes the journal events of its command and, through the
read-model fold, the rows that must be readable the instant the answer
leaves (the pending Receipt). Nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import utc_now
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.domain.ingest import (
    blob_references,
    check_ingest,
    ingest_accepted,
    unverified_blob,
    withdrawal_accepted,
)
from contentsvc.domain.models import IngestCommand, WithdrawalCommand
from contentsvc.domain.normalize import text_route_refusal
from contentsvc.ids import new_id
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.plugins import registry
from contentsvc.readmodel.corpora import existing_corpora
from contentsvc.readmodel.fold import fold
from contentsvc.readmodel.uploads import verified_blobs


@dataclass(frozen=True)
class Accepted:
    receipt_id: str
    replayed: bool


SourceCommand = IngestCommand | WithdrawalCommand


def require_blob_read(p: Principal, cmd: IngestCommand) -> None:
    """A Blob reference reads the Blob: it needs blobs:read besides content:write (part 1 rule 8,
    possessing an id grants nothing; decisions-part2, "Blob references"), at the first reference."""
    references = blob_references(cmd)
    if references and not p.may("blobs:read"):
        raise ApiError(403, "forbidden", "The API key lacks the action blobs:read, which referencing a Blob"
                       " needs (besides content:write).", field=f"{references[0][0]}/blob_id")


async def routed_media_types(conn: AsyncConnection, commands: list[IngestCommand]) -> frozenset[str]:
    """The media types the active plan routes to a normalizer plugin, read only when a command
    references a Blob the built-in text path cannot read (the plan is read as committed, so an
    activation is seen by the next request)."""
    if not any(text_route_refusal(b.media_type) for c in commands for _, b in blob_references(c)):
        return frozenset()
    plan = await registry.active_plan(conn)
    if plan is None:
        return frozenset()
    return frozenset(role.role.removeprefix("normalizer:") for role in plan.roles
                     if role.role.startswith("normalizer:"))


def family_of(command: SourceCommand) -> str:
    """The idempotency route family of a command (part 1: ingests and batch entries share one,
    withdrawals have their own)."""
    return idempotency.INGEST if isinstance(command, IngestCommand) else idempotency.WITHDRAWAL


async def accept_source_commands(
    conn: AsyncConnection, p: Principal, commands: list[SourceCommand | ApiError]
) -> list[Accepted | ApiError]:
    """Accept ingest and withdrawal commands in one transaction.

    Entries that are already errors pass through; each other entry is
    checked on its own and becomes an Accepted receipt or an ApiError.
    """
    async with journal_transaction(conn):
        return await accept_in_transaction(conn, p, commands)


async def accept_in_transaction(
    conn: AsyncConnection, p: Principal, commands: list[SourceCommand | ApiError]
) -> list[Accepted | ApiError]:
    """accept_source_commands inside the caller's journal transaction: a connector page commits
    its Receipts with its checkpoint (decisions-part2 "Runs"). Ingests and withdrawals may be
    mixed: their events are appended in the commands' order, in one append (part 1 rule 17:
    activation follows acceptance order), so a withdrawal and a later re-send of the same
    Record are folded in that order."""
    results: list[Accepted | ApiError | None] = [c if isinstance(c, ApiError) else None for c in commands]
    live = [(i, c) for i, c in enumerate(commands) if not isinstance(c, ApiError)]
    routed = await routed_media_types(conn, [c for _, c in live if isinstance(c, IngestCommand)])
    for i, cmd in live:
        try:
            p.require_corpus(cmd.source.corpus_id)
            if isinstance(cmd, IngestCommand):
                require_blob_read(p, cmd)
                check_ingest(cmd, routed)
        except ApiError as exc:
            results[i] = exc
    live = [(i, c) for i, c in live if results[i] is None]
    if not live:
        return results  # type: ignore[return-value]

    known = await existing_corpora(conn, p.org_id, sorted({c.source.corpus_id for _, c in live}))
    for i, cmd in live:
        if cmd.source.corpus_id not in known:
            results[i] = not_found("corpus")
    live = [(i, c) for i, c in live if results[i] is None]

    # Every referenced Blob must be a verified Blob of the caller's Organization (part 1 rule 7).
    references = {i: blob_references(c) for i, c in live if isinstance(c, IngestCommand)}
    wanted = sorted({b.blob_id for refs in references.values() for _, b in refs})
    verified = await verified_blobs(conn, p.org_id, wanted) if wanted else {}
    for i, refs in references.items():
        missing = next((pointer for pointer, b in refs if b.blob_id not in verified), None)
        if missing is not None:
            results[i] = unverified_blob(f"{missing}/blob_id")
    live = [(i, c) for i, c in live if results[i] is None]

    # Two entries of one request with the same key (in one family): the later replays or conflicts.
    first_by_key: dict[tuple[str, str], tuple[int, bytes]] = {}
    claims: dict[str, list[idempotency.Claim]] = {}
    planned: dict[int, tuple[str, tuple[str, str]]] = {}  # index -> (receipt id, (family, key))
    same_request_later: list[tuple[int, int]] = []
    for i, cmd in live:
        digest = request_digest(cmd)
        keyed = (family_of(cmd), cmd.idempotency_key)
        if keyed in first_by_key:
            j, first_digest = first_by_key[keyed]
            if first_digest == digest:
                same_request_later.append((i, j))
            else:
                results[i] = idempotency.conflict()
            continue
        first_by_key[keyed] = (i, digest)
        receipt_id = new_id("rcp")
        planned[i] = (receipt_id, keyed)
        claims.setdefault(keyed[0], []).append(idempotency.Claim(cmd.idempotency_key, digest, 202, "receipt",
                                                                 receipt_id))

    priors: dict[tuple[str, str], idempotency.Prior | ApiError] = {}
    for family in sorted(claims):  # one order for every transaction: concurrent claims cannot deadlock
        for key, prior in (await idempotency.claim(conn, p.org_id, family, claims[family])).items():
            priors[(family, key)] = prior
    accepted_at = utc_now()
    new_events: list[NewEvent] = []
    for i, cmd in live:
        if i not in planned:
            continue
        receipt_id, keyed = planned[i]
        prior = priors.get(keyed)
        if isinstance(prior, ApiError):
            results[i] = prior
        elif prior is not None:
            results[i] = Accepted(prior.resource_id, replayed=True)
        else:
            if isinstance(cmd, IngestCommand):
                blobs = {b.blob_id: verified[b.blob_id] for _, b in references[i]}
                new_events.append(ingest_accepted(p.org_id, cmd, receipt_id, accepted_at, blobs))
            else:
                new_events.append(withdrawal_accepted(p.org_id, cmd, receipt_id, accepted_at))
            results[i] = Accepted(receipt_id, replayed=False)
    for i, j in same_request_later:
        first = results[j]
        results[i] = Accepted(first.receipt_id, replayed=True) if isinstance(first, Accepted) else first
    if new_events:
        await fold(conn, new_events)  # the pending Receipts, readable at once
        await append(conn, new_events)
    return results  # type: ignore[return-value]
