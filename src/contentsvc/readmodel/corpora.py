"""Read views of Corpora, shaped as the contract's responses and limited to the key's scope."""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.auth.principal import Principal
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import not_found
from contentsvc.domain.models import (
    Corpus,
    RetrievalView,
)


def corpus_view(r: dict) -> Corpus:
    return Corpus(
        corpus_id=r["corpus_id"],
        name=r["name"],
        created_at=iso(r["created_at"]),
        retrieval=RetrievalView(**r["retrieval"]),
        projection_generation_id=r["projection_generation_id"],
        vector_spaces=r["vector_spaces"],
    )


_CORPUS_COLUMNS = "corpus_id, name, created_at, retrieval, projection_generation_id, vector_spaces"


async def load_corpus(conn: AsyncConnection, org_id: str, corpus_id: str) -> Corpus | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"SELECT {_CORPUS_COLUMNS} FROM corpora WHERE org_id = %s AND corpus_id = %s", (org_id, corpus_id)
    )
    row = await cur.fetchone()
    return corpus_view(row) if row else None


async def corpus_or_404(conn: AsyncConnection, p: Principal, corpus_id: str) -> Corpus:
    """A Corpus named in the path: one outside the key's scope reads as absent, like a missing one."""
    corpus = await load_corpus(conn, p.org_id, corpus_id) if p.covers(corpus_id) else None
    if corpus is None:
        raise not_found("corpus")
    return corpus


# Corpora are never deleted, so a Corpus once seen exists for good: ingest
# skips a query per command for Corpora this process has seen.
_seen_corpora: set[tuple[str, str]] = set()


async def existing_corpora(conn: AsyncConnection, org_id: str, corpus_ids: list[str]) -> set[str]:
    known = {c for c in corpus_ids if (org_id, c) in _seen_corpora}
    unknown = [c for c in corpus_ids if c not in known]
    if unknown:
        cur = await conn.execute(
            "SELECT corpus_id FROM corpora WHERE org_id = %s AND corpus_id = ANY(%s)", (org_id, unknown)
        )
        found = {r[0] for r in await cur.fetchall()}
        if len(_seen_corpora) < 100_000:
            _seen_corpora.update((org_id, c) for c in found)
        known |= found
    return known


async def list_corpora(conn: AsyncConnection, p: Principal, after: str | None, limit: int) -> list[Corpus]:
    cur = conn.cursor(row_factory=dict_row)
    scope = None if p.corpora is None else sorted(p.corpora)
    await cur.execute(
        f"SELECT {_CORPUS_COLUMNS} FROM corpora WHERE org_id = %s AND corpus_id > %s"
        " AND (%s::text[] IS NULL OR corpus_id = ANY(%s::text[])) ORDER BY corpus_id LIMIT %s",
        (p.org_id, after or "", scope, scope, limit),
    )
    return [corpus_view(r) for r in await cur.fetchall()]
