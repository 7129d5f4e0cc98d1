"""Command handlers: validate, claim idempotency, append events, one transaction.

Each handler writes the journal events of its command and, through the
read-model fold, the rows that must be readable the instant the answer
leaves (the pending Receipt, the new Corpus). Nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from psycopg import AsyncConnection

from contentsvc import idempotency
from contentsvc.auth.principal import Principal
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.ingest import check_ingest, ingest_accepted, withdrawal_accepted
from contentsvc.domain.models import CorpusRequest, IngestCommand, WithdrawalCommand
from contentsvc.domain.retrieval import effective_retrieval
from contentsvc.errors import ApiError, not_found
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.readviews import existing_corpora
from projectors.readmodel import fold


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Accepted:
    receipt_id: str
    replayed: bool


SourceCommand = IngestCommand | WithdrawalCommand


async def accept_source_commands(
    conn: AsyncConnection, p: Principal, commands: list[SourceCommand | ApiError], family: str
) -> list[Accepted | ApiError]:
    """Accept ingest (or withdrawal) commands in one transaction.

    Entries that are already errors pass through; each other entry is
    checked on its own and becomes an Accepted receipt or an ApiError.
    """
    results: list[Accepted | ApiError | None] = [c if isinstance(c, ApiError) else None for c in commands]
    live = [(i, c) for i, c in enumerate(commands) if not isinstance(c, ApiError)]
    for i, cmd in live:
        try:
            p.require_corpus(cmd.source.corpus_id)
            if isinstance(cmd, IngestCommand):
                check_ingest(cmd)
        except ApiError as exc:
            results[i] = exc
    live = [(i, c) for i, c in live if results[i] is None]
    if not live:
        return results  # type: ignore[return-value]

    async with journal_transaction(conn):
        known = await existing_corpora(conn, p.org_id, sorted({c.source.corpus_id for _, c in live}))
        for i, cmd in live:
            if cmd.source.corpus_id not in known:
                results[i] = not_found("corpus")
        live = [(i, c) for i, c in live if results[i] is None]

        # Two entries of one request with the same key: the later replays or conflicts.
        first_by_key: dict[str, tuple[int, bytes]] = {}
        claims: list[idempotency.Claim] = []
        planned: dict[int, str] = {}
        same_request_later: list[tuple[int, int]] = []
        for i, cmd in live:
            digest = request_digest(cmd)
            if cmd.idempotency_key in first_by_key:
                j, first_digest = first_by_key[cmd.idempotency_key]
                if first_digest == digest:
                    same_request_later.append((i, j))
                else:
                    results[i] = idempotency.conflict()
                continue
            first_by_key[cmd.idempotency_key] = (i, digest)
            receipt_id = new_id("rcp")
            planned[i] = receipt_id
            claims.append(idempotency.Claim(cmd.idempotency_key, digest, 202, "receipt", receipt_id))

        priors = await idempotency.claim(conn, p.org_id, family, claims)
        accepted_at = utc_now()
        new_events: list[NewEvent] = []
        for i, cmd in live:
            if i not in planned:
                continue
            prior = priors.get(cmd.idempotency_key)
            if isinstance(prior, ApiError):
                results[i] = prior
            elif prior is not None:
                results[i] = Accepted(prior.resource_id, replayed=True)
            else:
                receipt_id = planned[i]
                make = ingest_accepted if isinstance(cmd, IngestCommand) else withdrawal_accepted
                new_events.append(make(p.org_id, cmd, receipt_id, accepted_at))
                results[i] = Accepted(receipt_id, replayed=False)
        for i, j in same_request_later:
            first = results[j]
            results[i] = Accepted(first.receipt_id, replayed=True) if isinstance(first, Accepted) else first
        if new_events:
            await fold(conn, new_events)  # the pending Receipts, readable at once
            await append(conn, new_events)
    return results  # type: ignore[return-value]


async def create_corpus(conn: AsyncConnection, p: Principal, req: CorpusRequest) -> tuple[str, bool]:
    """Returns (corpus_id, replayed)."""
    if p.corpora is not None and (req.corpus_id is None or req.corpus_id not in p.corpora):
        raise ApiError(403, "forbidden", "The API key's Corpus scope does not include this Corpus.")
    retrieval = effective_retrieval(req.retrieval)
    corpus_id = req.corpus_id or new_id("crp").lower()
    async with journal_transaction(conn):
        priors = await idempotency.claim(
            conn, p.org_id, idempotency.CORPORA,
            [idempotency.Claim(req.idempotency_key, request_digest(req), 201, "corpus", corpus_id)],
        )
        prior = priors.get(req.idempotency_key)
        if isinstance(prior, ApiError):
            raise prior
        if prior is not None:
            return prior.resource_id, True
        # Serializes creators of one corpus id (different keys, same id).
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"corpus:{p.org_id}:{corpus_id}",))
        if await existing_corpora(conn, p.org_id, [corpus_id]):
            raise ApiError(409, "corpus_exists", f"Corpus {corpus_id!r} already exists.", field="/corpus_id")
        event = NewEvent(
            kind=ev.CORPUS_CREATED,
            org_id=p.org_id,
            corpus_id=corpus_id,
            subject_type="corpus",
            subject_id=corpus_id,
            payload={
                "corpus_id": corpus_id,
                "name": req.name,
                "retrieval": retrieval,
                "projection_generation_id": new_id("gen"),
                "vector_spaces": [],
                "created_at": utc_now(),
            },
        )
        await fold(conn, [event])
        await append(conn, [event])
    return corpus_id, False
