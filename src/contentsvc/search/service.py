"""searchRecords (part 1 rule 20): profile, prefilters, candidates, hydration, excerpts.

Every hit is re-read from the read tables and re-authorized at search
time: only the current, non-withdrawn, searchable Version of a Record in a
Corpus the key may read now is returned, whatever the index still holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import tantivy
from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.domain.models import (
    Excerpt,
    Explanation,
    ProfileRef,
    SearchHit,
    SearchProfile,
    SearchRequest,
    SearchResponse,
)
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.overlap import overlapped
from contentsvc.readmodel import vectors as current_vectors
from contentsvc.search import generations, lexical_index, semantic, vector_index
from contentsvc.search.corpus_routes import CorpusRoutes
from contentsvc.search.embedding import EmbeddingModelMissing
from contentsvc.search.excerpts import Excerpter, query_terms
from contentsvc.search.fusion import Fusion
from contentsvc.search.semantic_scopes import SemanticScopes

MAX_QUERY_CHARS = 8192
PROFILES = [
    # Version 2: English stemming, CJK bigrams, one scored text field, z-score fusion.
    SearchProfile(name="default", version="2", default=True, modes=["lexical", "semantic", "hybrid"],
                  max_latency_ms=2000, max_query_chars=MAX_QUERY_CHARS),
    SearchProfile(name="rrf", version="1", default=False, modes=["lexical", "semantic", "hybrid"],
                  max_latency_ms=2000, max_query_chars=MAX_QUERY_CHARS),
]
# How each profile fuses a hybrid search; chosen by two-fold cross-validation on SciFact (docs/decisions.md
# "Hybrid fusion"). RRF's k = 10 was chosen on Cranfield (nDCG@10 0.4007 vs 0.3962 at the customary 60).
FUSIONS = {"default": Fusion("zscore", lexical_weight=0.5), "rrf": Fusion("rrf", rrf_k=10)}
CANDIDATE_ROUNDS = 3
STALE_SLACK = 2  # candidates beyond a lexical page's hits


def search_unavailable(why: str) -> ApiError:
    return ApiError(503, "search_unavailable", f"The search index is unavailable ({why}); retry later.",
                    retryable=True)


def embedding_model_missing(exc: EmbeddingModelMissing) -> ApiError:
    """Semantic and hybrid search without the query embedder: the operator's fix, named."""
    return ApiError(503, "search_unavailable",
                    f"Semantic and hybrid search are unavailable: the embedding model of vector space"
                    f" {vector_index.SPACE!r} is not installed on the server. {exc} Then restart the"
                    " service. Lexical search works meanwhile.", retryable=True)


class LexicalSearcher:
    """The serving lexical generation, opened read-only, reloaded after each projector commit."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self._generation: str | None = None
        self._index: tantivy.Index | None = None
        self._layout = lexical_index.CURRENT
        self._commit: tuple[int, int, int] | None = None  # the loaded commit's meta.json (inode, mtime, size)
        self._alone: dict[tuple[tuple[str, ...], int], bool] = {}  # lexical_index.holds_everything, by index state

    def index(self, generation_id: str | None) -> tuple[tantivy.Index, lexical_index.Layout]:
        """The serving generation's index, as of its last commit.
        Every commit replaces meta.json, and the lexical projector commits before it publishes
        what the commit made searchable: a search that sees a new meta.json (one stat, about
        2 us) reloads, so a Version a Receipt shows searchable is found by the next search
        (part 1, ingest rules), and a generation the read model routes to is loaded complete."""
        if generation_id is None:
            raise search_unavailable("no lexical generation has been built yet")
        path = generations.index_path(self.home, generations.LEXICAL, generation_id)
        try:
            meta = (path / "meta.json").stat()
        except FileNotFoundError:  # files gone: an error, never empty hits
            raise search_unavailable(f"generation {generation_id} has no index files") from None
        if generation_id != self._generation:
            try:
                self._index, self._layout = lexical_index.open_index(path)
            except lexical_index.IndexUnavailable as exc:
                raise search_unavailable(str(exc)) from None
            self._generation, self._commit = generation_id, None
        if self._commit != (commit := (meta.st_ino, meta.st_mtime_ns, meta.st_size)):
            self._commit = commit
            self._index.reload()
            self._alone = {}
        return self._index, self._layout

    def alone(self, routed: list[str]) -> bool:
        """Whether the `routed` projection generations hold every live document of the index
        opened last (lexical_index.search then filters its hits, not its query). Kept until the
        next reload, and keyed by the document count too, for a reader that reloaded itself:
        a stale answer costs a search twice, never a wrong hit."""
        key = (tuple(sorted(routed)), self._index.searcher().num_docs)
        alone = self._alone.get(key)
        if alone is None:
            alone = self._alone[key] = lexical_index.holds_everything(self._index, routed)
        return alone


class VectorSearcher:
    """The serving vector generation's latest hnswlib snapshot (loaded when a search's scope
    is too large to scan exactly), the scopes' labels, and the query embedder."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.scopes = SemanticScopes()
        self._file: str | None = None
        self._index = None
        self._embedder = None
        self._lock = asyncio.Lock()

    async def index(self, conn: AsyncConnection) -> semantic.ServedIndex:
        generation = await generations.serving(conn, generations.VECTORS)
        if generation is None:
            raise search_unavailable("no vector generation has been built yet")
        directory = generation.path(self.home)
        snapshot = vector_index.read_snapshot(directory)
        if snapshot is None:
            if self._index is not None and self._file and self._file.startswith(generation.generation_id):
                return self._index  # the files moved under us: answer from the loaded snapshot
            raise search_unavailable(f"vector generation {generation.generation_id} has no snapshot yet")
        key = f"{generation.generation_id}/{snapshot.file}"
        if key != self._file:
            async with self._lock:
                if key != self._file:
                    loaded = await asyncio.to_thread(vector_index.load, directory, snapshot)
                    self._index = await asyncio.to_thread(semantic.ServedIndex.of, loaded)
                    self._file = key
        return self._index

    async def warm(self) -> None:
        """Loads the query embedder once per process; search() calls it before its deadline starts.
        Without the model files a semantic or hybrid search is 503 naming the fix (the model is
        looked for again on the next search: an operator may install it and restart)."""
        if self._embedder is None:
            async with self._lock:
                if self._embedder is None:
                    from contentsvc.search.embedding import MiniLMEmbedder

                    try:
                        # One thread per query: concurrent searches share the cores instead of
                        # oversubscribing them.
                        self._embedder = await asyncio.to_thread(MiniLMEmbedder, threads=1)
                    except EmbeddingModelMissing as exc:
                        raise embedding_model_missing(exc) from None

    async def embed(self, text: str):
        await self.warm()
        return await asyncio.to_thread(self._embedder.embed_query, text)

    async def check_query_window(self, text: str) -> None:
        """The space owner's limit (part 1 rule 20): a query longer than the model's token
        window would be embedded truncated, so it is refused, naming that limit."""
        await self.warm()
        tokens = self._embedder.count_tokens(text)
        if tokens > self._embedder.token_window:
            raise ApiError(422, "query_too_long",
                           f"The query is {tokens} tokens long; the vector space {vector_index.SPACE!r} (owner"
                           f" engine, model {self._embedder.model_name}) accepts at most"
                           f" {self._embedder.token_window} tokens. Shorten it, or search lexically.",
                           field="/query")


@dataclass
class Hydrated:
    version_id: str
    record_id: str
    corpus_id: str
    parts: dict[str, str] | None  # Part key -> text; None until a hit needs them


# Every current, searchable, authorized Version among the candidates (given best first), and the
# manifests of the first `texts` of them only: a page of 10 hits rarely needs the texts of the
# 30 candidates behind it, and manifests are most of what the read carries.
_HYDRATE = """
SELECT v.version_id, v.record_id, v.corpus_id,
       CASE WHEN row_number() OVER (ORDER BY c.rank) <= %s THEN v.manifest END
FROM unnest(%s::text[]) WITH ORDINALITY AS c(version_id, rank)
JOIN versions v ON v.version_id = c.version_id JOIN records r ON r.record_id = v.record_id
WHERE v.org_id = %s AND v.corpus_id = ANY(%s)
  AND r.current_version_id = v.version_id AND NOT r.withdrawn AND v.searchable
  AND (%s::text[] IS NULL OR r.namespace = ANY(%s::text[]))
"""


def _texts(manifest: dict) -> dict[str, str]:
    return {p["key"]: p["content"]["text"] for p in manifest["parts"] if p["content"].get("kind") == "text"}


async def _hydrate(conn: AsyncConnection, org_id: str, corpus_ids: list[str], version_ids: list[str],
                   namespaces: list[str] | None, texts: int) -> dict[str, Hydrated]:
    """The current, searchable, authorized Versions among `version_ids` (best first), with the
    Part texts of the first `texts` of them."""
    cur = await conn.execute(_HYDRATE, (texts, version_ids, org_id, corpus_ids, namespaces, namespaces))
    return {version_id: Hydrated(version_id, record_id, corpus_id, None if manifest is None else _texts(manifest))
            for version_id, record_id, corpus_id, manifest in await cur.fetchall()}


async def _fill_texts(conn: AsyncConnection, hydrated: dict[str, Hydrated], version_ids: list[str]) -> None:
    """Reads the Part texts of hits whose texts the hydration left out (a fused hit from deep
    in one of its lists). A Version never changes, and these were authorized in this search."""
    missing = [v for v in version_ids if hydrated[v].parts is None]
    if missing:
        cur = await conn.execute("SELECT version_id, manifest FROM versions WHERE version_id = ANY(%s)", (missing,))
        for version_id, manifest in await cur.fetchall():
            hydrated[version_id].parts = _texts(manifest)


def _validate(p: Principal, req: SearchRequest) -> SearchProfile:
    profile = next((x for x in PROFILES if x.name == req.profile), None)
    if profile is None:
        raise ApiError(422, "unsupported_profile", f"Search profile {req.profile!r} is not available.",
                       field="/profile")
    if len(req.query) > profile.max_query_chars:
        raise ApiError(422, "query_too_long",
                       f"The query exceeds the limit of search profile {profile.name!r},"
                       f" {profile.max_query_chars} characters.",
                       field="/query")
    if len(set(req.corpus_ids)) != len(req.corpus_ids):
        raise ApiError(422, "invalid_schema", "corpus_ids must be unique.", field="/corpus_ids")
    if req.filter and len(set(req.filter.source_namespaces)) != len(req.filter.source_namespaces):
        raise ApiError(422, "invalid_schema", "source_namespaces must be unique.",
                       field="/filter/source_namespaces")
    for corpus_id in req.corpus_ids:
        p.require_corpus(corpus_id)
    return profile


async def search(conn: AsyncConnection, routes: CorpusRoutes, lexical: LexicalSearcher, vectors: VectorSearcher,
                 p: Principal, req: SearchRequest) -> SearchResponse:
    profile = _validate(p, req)
    corpora, lexical_generation = await routes.routes(conn, p.org_id, req.corpus_ids)
    spaces = {c.corpus_id: c.vector_spaces for c in corpora}
    routed = [c.projection_generation_id for c in corpora]  # each Corpus's serving projection generation
    missing = [c for c in req.corpus_ids if c not in spaces]
    if missing:
        raise not_found(f"corpus {missing[0]!r}")
    with_vectors = [c for c in req.corpus_ids if vector_index.SPACE in spaces[c]]
    if req.mode == "semantic" and len(with_vectors) < len(req.corpus_ids):
        without = next(c for c in req.corpus_ids if c not in with_vectors)
        raise ApiError(422, "unsupported_search", f"Corpus {without!r} has no vector space; semantic search"
                       " needs one (use lexical or hybrid).", field="/mode")
    if with_vectors and req.mode in ("semantic", "hybrid"):
        # A process's first load of the model is not this search's latency.
        await vectors.check_query_window(req.query)
    try:
        # In this task (a deadline, not wait_for's task of its own: 30-60 us a search).
        async with asyncio.timeout(profile.max_latency_ms / 1000):
            items = await _hits(conn, lexical, vectors, p, req, with_vectors, routed, lexical_generation,
                                {c.corpus_id: c.projection_generation_id for c in corpora})
    except TimeoutError:
        raise ApiError(504, "search_deadline_exceeded",
                       f"The search took longer than the profile's {profile.max_latency_ms} ms.",
                       retryable=True) from None
    return SearchResponse(items=items, retrieval_profile=ProfileRef(name=profile.name, version=profile.version))


@dataclass
class Ranked:
    """One Version's best segment from one retriever, in rank order."""

    version_id: str
    record_id: str
    part_key: str
    segment_start: int
    score: float
    text: str | None = None  # the segment's text, where the lexical index stores it


async def _ranked(conn: AsyncConnection, p: Principal, req: SearchRequest, fetch, wanted: int, texts: int,
                  rounds: int = CANDIDATE_ROUNDS, meanwhile=None) -> tuple[list, dict]:
    """Candidates of `wanted` Versions from `fetch(wanted)` (best first), hydrated (with the
    Part texts of the first `texts` Versions) and collapsed per Version, asking for four times
    as many when too many were stale (up to `rounds`). `meanwhile(candidates)`: work on them
    that needs no read model, done while PostgreSQL answers the hydration."""
    hydrated: dict = {}
    best: dict[str, Ranked] = {}
    for _ in range(rounds):
        candidates = await fetch(wanted)
        versions = list(dict.fromkeys(c.version_id for c in candidates))
        hydrating = _hydrate(conn, p.org_id, req.corpus_ids, versions,
                             req.filter.source_namespaces if req.filter else None, texts)
        hydrated = await (overlapped(hydrating, lambda: meanwhile(candidates)) if meanwhile else hydrating)
        best = {}
        for c in candidates:  # best segment per Version, in score order
            if c.version_id in hydrated and c.version_id not in best:
                best[c.version_id] = c
        if len(best) >= req.limit or len(versions) < wanted:
            break
        wanted *= 4
    return list(best.values()), hydrated


async def _hits(conn: AsyncConnection, lexical: LexicalSearcher, vectors: VectorSearcher, p: Principal,
                req: SearchRequest, with_vectors: list[str], routed: list[str],
                lexical_generation: str | None, projection_of: dict[str, str]) -> list[SearchHit]:
    # Versions asked of each retriever. A fused list draws on both lists beyond the page; a lexical
    # page needs only its hits and a little slack for stale candidates (Versions the index still
    # holds but the read model no longer serves): a widening round asks for more when too many
    # were stale. Each candidate costs a stored document's read and a row of the hydration.
    wanted = req.limit + STALE_SLACK if req.mode == "lexical" else req.limit * 2 + 10
    namespaces = req.filter.source_namespaces if req.filter else None
    lexical_ranked, semantic_ranked, hydrated = [], [], {}
    # The lexical index serves the excerpts' segment texts too, where it stores them; else the
    # hydration reads the Part texts of the page's Versions.
    if req.mode == "semantic":
        index, layout = _segment_store(lexical, lexical_generation)
    else:
        index, layout = lexical.index(lexical_generation)
    texts = 0 if layout is not None and layout.stores_segments else req.limit
    excerpts = _Excerpts(req.query, req.limit, index, layout)
    if req.mode in ("lexical", "hybrid"):
        # On the event loop, not in a worker thread: the hop cost more than the search (a c=1
        # probe: p50 4.4 -> 4.2 ms; at c=8: 300 -> 390 searches/s, p99 45 -> 28 ms).
        async def fetch_lexical(n: int):
            return lexical_index.search(index, layout, p.org_id, routed, req.query, n, namespaces,
                                        alone=not namespaces and lexical.alone(routed))

        lexical_ranked, found = await _ranked(conn, p, req, fetch_lexical, wanted, texts,
                                              meanwhile=excerpts.ahead if req.mode == "lexical" else None)
        hydrated.update(found)
    if req.mode == "semantic":
        uncovered = await current_vectors.uncovered(conn, vector_index.SPACE, p.org_id, with_vectors)
        if uncovered:  # part 1 rule 20: semantic-only queries require vector coverage
            raise ApiError(422, "unsupported_search",
                           f"Corpus {uncovered[0]!r} has no vector coverage yet (no current Record embedded in"
                           f" {vector_index.SPACE!r}); search lexical or hybrid, or retry once listVectorSpaces"
                           " shows coverage.", field="/mode")
    if req.mode in ("semantic", "hybrid") and with_vectors:
        query_vector = await vectors.embed(req.query)

        async def fetch_semantic(n: int):
            return await _semantic_candidates(conn, vectors, query_vector, p.org_id, with_vectors, namespaces, n)

        # Candidates are in scope before ranking: no widening round can add any.
        semantic_ranked, found = await _ranked(conn, p, req, fetch_semantic, wanted, texts, rounds=1)
        hydrated.update(found)

    if req.mode == "hybrid":
        fused = FUSIONS[req.profile].fuse(lexical_ranked, semantic_ranked)
    else:
        ranked = lexical_ranked or semantic_ranked
        fused = [(r, r.score) for r in ranked]
    lexical_rank = {r.version_id: i for i, r in enumerate(lexical_ranked, start=1)}
    semantic_rank = {r.version_id: i for i, r in enumerate(semantic_ranked, start=1)}
    page = fused[: req.limit]
    segments = await _segment_texts(conn, hydrated, [r for r, _ in page], index, layout, projection_of)
    hits = []
    for rank, (r, score) in enumerate(page, start=1):
        segment = segments[_segment_key(r)]
        start, end = excerpts.of(r, segment)
        hits.append(SearchHit(
            rank=rank, record_id=r.record_id, version_id=r.version_id, part_key=r.part_key,
            excerpt=Excerpt(text=segment[start - r.segment_start:end - r.segment_start], start=start, end=end),
            explanation=Explanation(lexical_rank=lexical_rank.get(r.version_id),
                                    semantic_rank=semantic_rank.get(r.version_id), score=round(score, 6)),
        ))
    return hits


class _Excerpts:
    """The excerpts of one search's hits, each cut once. A lexical page's are cut ahead, from
    the segment texts its candidates carry, while PostgreSQL reads which of them are current:
    the hydration's round trip and the excerpts' CPU overlap (SciFact, one search at a time)."""

    def __init__(self, query: str, limit: int, index, layout) -> None:
        self.query, self.limit, self.index, self.layout = query, limit, index, layout
        self.cut: dict[tuple[str, str, int], tuple[int, int]] = {}

    @cached_property
    def excerpter(self) -> Excerpter:
        """Made at the first excerpt: a search without hits weighs no terms."""
        terms = query_terms(self.query)
        # Each query term's weight in the lexical index, where the search has one.
        weights = lexical_index.term_weights(self.index, self.layout, terms) if self.index is not None else None
        return Excerpter(terms, weights)

    def ahead(self, candidates: list) -> None:
        """The excerpts of the best segment of each of the first `limit` Versions (the page, when
        none of them turns out stale)."""
        versions: set[str] = set()
        for c in candidates:
            if c.version_id not in versions and c.text is not None:
                versions.add(c.version_id)
                self.of(c, c.text)
                if len(versions) == self.limit:
                    return

    def of(self, r, segment: str) -> tuple[int, int]:
        key = _segment_key(r)
        if key not in self.cut:
            self.cut[key] = self.excerpter.cut(segment, r.segment_start)
        return self.cut[key]


def _segment_store(lexical: LexicalSearcher,
                   generation_id: str | None) -> tuple[tantivy.Index | None, lexical_index.Layout | None]:
    """The lexical index, for the segment texts of a semantic page; none when it cannot be
    opened (a semantic search does not depend on it: the hydration reads the texts instead)."""
    try:
        return lexical.index(generation_id)
    except ApiError:
        return None, None


async def _segment_texts(conn: AsyncConnection, hydrated: dict[str, Hydrated], page: list, index, layout,
                         projection_of: dict[str, str]) -> dict[tuple[str, str, int], str]:
    """The text of each hit's segment, by (version_id, part_key, segment_start): as the lexical
    index returned it, else looked up in that index (a hit only the semantic list holds), else
    cut from the Version's Part text."""
    out = {_segment_key(r): r.text for r in page if r.text is not None}
    if layout is not None and layout.stores_segments:
        lookups = [(projection_of[hydrated[r.version_id].corpus_id], *_segment_key(r))
                   for r in page if _segment_key(r) not in out]
        for (_, *key), text in lexical_index.stored_segments(index, layout, lookups).items():
            out[tuple(key)] = text
    missing = [r for r in page if _segment_key(r) not in out]
    await _fill_texts(conn, hydrated, [r.version_id for r in missing])
    for r in missing:
        text = hydrated[r.version_id].parts.get(r.part_key, "")
        out[_segment_key(r)] = lexical_index.segment_at(text, r.segment_start)
    return out


def _segment_key(r) -> tuple[str, str, int]:
    return r.version_id, r.part_key, r.segment_start


async def _semantic_candidates(conn: AsyncConnection, vectors: VectorSearcher, query_vector, org_id: str,
                               corpus_ids: list[str], namespaces: list[str] | None, versions: int) -> list[Ranked]:
    """The nearest Versions among those the search's scope allows, each by its best segment."""
    scope = await vectors.scopes.scope(conn, vector_index.SPACE, org_id, corpus_ids, namespaces)
    best = await semantic.nearest(conn, lambda: vectors.index(conn), query_vector, scope, versions)
    segments = await current_vectors.segments(conn, [label for label, _ in best])
    return [Ranked(*segments[label], score) for label, score in best if label in segments]
