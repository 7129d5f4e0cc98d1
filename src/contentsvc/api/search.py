"""searchRecords, listSearchProfiles (part 1 rules 20, 21) and listVectorSpaces (rule 16)."""

from __future__ import annotations

from litestar import Response

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.domain.models import (
    SearchProfileList,
    SearchRequest,
    SearchResponse,
    VectorSpace,
    VectorSpaceList,
)
from contentsvc.readmodel import vectors as current_vectors
from contentsvc.readmodel.corpora import corpus_or_404
from contentsvc.search import service, vector_index
from contentsvc.search.embedding import DIMENSIONS, METRIC, MODEL_NAME


@operation("searchRecords", "POST", "/v0/search", permission=("content:read", "search:query"),
           body=SearchRequest, responses={200: SearchResponse})
async def search_records(call: Call[SearchRequest, None]) -> Response:
    svc = services(call.request)
    if call.body.mode in ("semantic", "hybrid"):
        # A process's first load of the query model is no wait on the database: not while
        # holding a pooled connection (its answer bound, database.unresponsive_seconds).
        await svc.vectors.warm()
    async with svc.pool.connection() as conn:
        result = await service.search(conn, svc.search_routes, svc.lexical, svc.vectors, call.principal, call.body)
    return respond(result)


@operation("listSearchProfiles", "GET", "/v0/search/profiles", permission=("search:query",),
           responses={200: SearchProfileList})
async def list_search_profiles(call: Call[None, None]) -> Response:
    return respond(SearchProfileList(items=service.PROFILES))


@operation("listVectorSpaces", "GET", "/v0/corpora/{corpus_id}/vector-spaces", permission=("corpora:read",),
           responses={200: VectorSpaceList})
async def list_vector_spaces(call: Call[None, None], corpus_id: str) -> Response:
    p = call.principal
    async with services(call.request).pool.connection() as conn:
        corpus = await corpus_or_404(conn, p, corpus_id)
        items = []
        if vector_index.SPACE in corpus.vector_spaces:
            # Coverage: current segments holding a vector in this space.
            items.append(VectorSpace(
                name=vector_index.SPACE, owner="engine", model=MODEL_NAME, dimensions=DIMENSIONS, metric=METRIC,
                indexed_modalities=["text"], query_modalities=["text"], role="served",
                coverage=await current_vectors.coverage(conn, vector_index.SPACE, p.org_id, corpus_id)))
    return respond(VectorSpaceList(items=items))


ROUTES = [search_records, list_search_profiles, list_vector_spaces]
