"""createCorpus: the Corpus and its first projection generation, readable at once."""

from __future__ import annotations

from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import utc_now
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import CorpusRequest
from contentsvc.domain.retrieval import effective_retrieval
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.readmodel.corpora import existing_corpora
from contentsvc.readmodel.fold import fold
from contentsvc.search.engine_space import SPACE, engine_vectors_enabled


async def create_corpus(conn: AsyncConnection, p: Principal, req: CorpusRequest) -> tuple[str, bool]:
    """Returns (corpus_id, replayed)."""
    if p.corpora is not None and (req.corpus_id is None or req.corpus_id not in p.corpora):
        raise ApiError(403, "forbidden", "The API key's Corpus scope does not include this Corpus.")
    retrieval = effective_retrieval(req.retrieval)
    corpus_id = req.corpus_id or new_id("crp").lower()
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, idempotency.CORPORA, req.idempotency_key,
                                            request_digest(req), 201, "corpus", corpus_id)
        if prior is not None:
            return prior, True
        # Serializes creators of one corpus id (different keys, same id).
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"corpus:{p.org_id}:{corpus_id}",))
        if await existing_corpora(conn, p.org_id, [corpus_id]):
            raise ApiError(409, "corpus_exists", f"Corpus {corpus_id!r} already exists.", field="/corpus_id")
        event = NewEvent(
            org_id=p.org_id,
            corpus_id=corpus_id,
            subject_type="corpus",
            subject_id=corpus_id,
            payload=ev.CorpusCreated(
                corpus_id=corpus_id,
                name=req.name,
                retrieval=retrieval,
                projection_generation_id=new_id("gen"),
                vector_spaces=[SPACE] if engine_vectors_enabled() else [],
                created_at=utc_now(),
            ),
        )
        await fold(conn, [event])
        await append(conn, [event])
    return corpus_id, False


