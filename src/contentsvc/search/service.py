"""searchRecords (part 1 rule 20): profile, prefilters, candidates, hydration, excerpts.

Every hit is re-read from the read tables and re-authorized at search
time: only the current, non-withdrawn, searchable Version of a Record in a
Corpus the key may read now is returned, whatever the index still holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import tantivy
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.auth.principal import Principal
from contentsvc.changefeed import FeedTicker
from contentsvc.domain.models import (
    Excerpt,
    Explanation,
    ProfileRef,
    SearchHit,
    SearchProfile,
    SearchRequest,
    SearchResponse,
)
from contentsvc.errors import ApiError, not_found
from contentsvc.readviews import existing_corpora
from contentsvc.search import generations, lexical_index
from contentsvc.search.excerpts import excerpt, query_terms

MAX_QUERY_CHARS = 8192
PROFILES = [
    SearchProfile(name="default", version="1", default=True, modes=["lexical", "semantic", "hybrid"],
                  max_latency_ms=2000, max_query_chars=MAX_QUERY_CHARS),
]
RRF_K = 60
CANDIDATE_ROUNDS = 3


def search_unavailable(why: str) -> ApiError:
    return ApiError(503, "search_unavailable", f"The search index is unavailable ({why}); retry later.",
                    retryable=True)


class LexicalSearcher:
    """The serving lexical generation, opened read-only, reloaded after each projector commit."""

    def __init__(self, home: Path, moved: FeedTicker) -> None:
        self.home = home
        self.moved = moved
        self._generation: str | None = None
        self._index: tantivy.Index | None = None
        self._seen = -1

    async def index(self, conn: AsyncConnection) -> tantivy.Index:
        generation = await generations.serving(conn, lexical_index_kind())
        if generation is None:
            raise search_unavailable("no lexical generation has been built yet")
        path = generation.path(self.home)
        if not (path / "meta.json").exists():  # files gone: an error, never empty hits
            raise search_unavailable(f"generation {generation.generation_id} has no index files")
        if generation.generation_id != self._generation:
            try:
                self._index = lexical_index.open_index(path)
            except lexical_index.IndexUnavailable as exc:
                raise search_unavailable(str(exc)) from None
            self._generation, self._seen = generation.generation_id, -1
        if self._seen != self.moved.count:
            self._seen = self.moved.count
            self._index.reload()
        return self._index


def lexical_index_kind() -> str:
    return "lexical"


@dataclass
class Hydrated:
    version_id: str
    record_id: str
    corpus_id: str
    parts: dict[str, str]


_HYDRATE = """
SELECT v.version_id, v.record_id, v.corpus_id, v.manifest
FROM versions v JOIN records r ON r.record_id = v.record_id
WHERE v.version_id = ANY(%s) AND v.org_id = %s AND v.corpus_id = ANY(%s)
  AND r.current_version_id = v.version_id AND NOT r.withdrawn AND v.searchable
"""


async def _hydrate(conn: AsyncConnection, org_id: str, corpus_ids: list[str], version_ids: list[str]) -> dict:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_HYDRATE, (version_ids, org_id, corpus_ids))
    out = {}
    for row in await cur.fetchall():
        parts = {p["key"]: p["content"]["text"] for p in row["manifest"]["parts"] if p["content"].get("kind") == "text"}
        out[row["version_id"]] = Hydrated(row["version_id"], row["record_id"], row["corpus_id"], parts)
    return out


def _validate(p: Principal, req: SearchRequest) -> SearchProfile:
    profile = next((x for x in PROFILES if x.name == req.profile), None)
    if profile is None:
        raise ApiError(422, "unsupported_profile", f"Search profile {req.profile!r} is not available.",
                       field="/profile")
    if len(req.query) > profile.max_query_chars:
        raise ApiError(422, "query_too_long",
                       f"The query exceeds the profile's limit of {profile.max_query_chars} characters.",
                       field="/query")
    if len(set(req.corpus_ids)) != len(req.corpus_ids):
        raise ApiError(422, "invalid_schema", "corpus_ids must be unique.", field="/corpus_ids")
    if req.filter and len(set(req.filter.source_namespaces)) != len(req.filter.source_namespaces):
        raise ApiError(422, "invalid_schema", "source_namespaces must be unique.",
                       field="/filter/source_namespaces")
    for corpus_id in req.corpus_ids:
        p.require_corpus(corpus_id)
    return profile


async def search(conn: AsyncConnection, lexical: LexicalSearcher, p: Principal, req: SearchRequest) -> SearchResponse:
    profile = _validate(p, req)
    known = await existing_corpora(conn, p.org_id, req.corpus_ids)
    missing = [c for c in req.corpus_ids if c not in known]
    if missing:
        raise not_found(f"corpus {missing[0]!r}")
    if req.mode == "semantic":
        raise ApiError(422, "unsupported_search",
                       "Semantic search needs a vector space; these Corpora have none.", field="/mode")
    try:
        items = await asyncio.wait_for(_lexical_hits(conn, lexical, p, req), profile.max_latency_ms / 1000)
    except asyncio.TimeoutError:
        raise ApiError(504, "search_deadline_exceeded",
                       f"The search took longer than the profile's {profile.max_latency_ms} ms.",
                       retryable=True) from None
    return SearchResponse(items=items, retrieval_profile=ProfileRef(name=profile.name, version=profile.version))


async def _lexical_hits(conn: AsyncConnection, lexical: LexicalSearcher, p: Principal,
                        req: SearchRequest) -> list[SearchHit]:
    index = await lexical.index(conn)
    namespaces = req.filter.source_namespaces if req.filter else None
    terms = query_terms(req.query)
    wanted = req.limit * 3 + 10
    for _ in range(CANDIDATE_ROUNDS):
        candidates = await asyncio.to_thread(
            lexical_index.search, index, p.org_id, req.corpus_ids, req.query, wanted, namespaces)
        hydrated = await _hydrate(conn, p.org_id, req.corpus_ids, list({c.version_id for c in candidates}))
        best: dict[str, lexical_index.Candidate] = {}
        for c in candidates:  # best segment per Version, in score order
            if c.version_id in hydrated and c.version_id not in best:
                best[c.version_id] = c
        if len(best) >= req.limit or len(candidates) < wanted:
            break
        wanted *= 4  # many stale candidates: ask the index for more
    hits = []
    for rank, c in enumerate(list(best.values())[: req.limit], start=1):
        text = hydrated[c.version_id].parts.get(c.part_key, "")
        segment = text[c.segment_start: c.segment_start + lexical_index.SEGMENT_CHARS]
        start, end = excerpt(segment, terms, offset=c.segment_start)
        hits.append(SearchHit(
            rank=rank, record_id=c.record_id, version_id=c.version_id, part_key=c.part_key,
            excerpt=Excerpt(text=text[start:end], start=start, end=end),
            explanation=Explanation(lexical_rank=rank, score=round(c.score, 6)),
        ))
    return hits
