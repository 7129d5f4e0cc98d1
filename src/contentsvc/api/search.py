"""searchRecords, listSearchProfiles (part 1 rules 20, 21) and listVectorSpaces (rule 16)."""

from __future__ import annotations

from litestar import Request, Response, get, post

from contentsvc.api.http import authenticate, read_json, respond, services
from contentsvc.config import MAX_INGEST_BYTES
from contentsvc.domain.models import (
    SearchProfileList,
    SearchRequest,
    VectorSpace,
    VectorSpaceList,
)
from contentsvc.readmodel import vectors as current_vectors
from contentsvc.readmodel.corpora import corpus_or_404
from contentsvc.search import service, vector_index
from contentsvc.search.embedding import DIMENSIONS, METRIC, MODEL_NAME


@post("/v0/search", operation_id="searchRecords", status_code=200)
async def search_records(request: Request) -> Response:
    p = await authenticate(request, "content:read", "search:query")
    req = await read_json(request, SearchRequest, MAX_INGEST_BYTES)
    svc = services(request)
    async with svc.pool.connection() as conn:
        result = await service.search(conn, svc.lexical, svc.vectors, p, req)
    return respond(result)


@get("/v0/search/profiles", operation_id="listSearchProfiles")
async def list_search_profiles(request: Request) -> Response:
    await authenticate(request, "search:query")
    return respond(SearchProfileList(items=service.PROFILES))


@get("/v0/corpora/{corpus_id:str}/vector-spaces", operation_id="listVectorSpaces")
async def list_vector_spaces(request: Request, corpus_id: str) -> Response:
    p = await authenticate(request, "corpora:read")
    async with services(request).pool.connection() as conn:
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
