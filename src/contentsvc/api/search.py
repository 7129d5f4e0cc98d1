"""searchRecords, listSearchProfiles (part 1 rules 20, 21) and listVectorSpaces (rule 16)."""

from __future__ import annotations

from litestar import Request, Response, get, post

from contentsvc.api.http import authenticate, read_json, respond, services
from contentsvc.config import MAX_INGEST_BYTES
from contentsvc.domain.models import SearchProfileList, SearchRequest
from contentsvc.errors import not_found
from contentsvc.readviews import existing_corpora
from contentsvc.search import service


@post("/v0/search", operation_id="searchRecords", status_code=200)
async def search_records(request: Request) -> Response:
    p = await authenticate(request, "content:read", "search:query")
    req = await read_json(request, SearchRequest, MAX_INGEST_BYTES)
    svc = services(request)
    async with svc.pool.connection() as conn:
        result = await service.search(conn, svc.lexical, p, req)
    return respond(result)


@get("/v0/search/profiles", operation_id="listSearchProfiles")
async def list_search_profiles(request: Request) -> Response:
    await authenticate(request, "search:query")
    return respond(SearchProfileList(items=service.PROFILES))


@get("/v0/corpora/{corpus_id:str}/vector-spaces", operation_id="listVectorSpaces")
async def list_vector_spaces(request: Request, corpus_id: str) -> Response:
    p = await authenticate(request, "corpora:read")
    if not p.covers(corpus_id):
        raise not_found("corpus")
    async with services(request).pool.connection() as conn:
        if not await existing_corpora(conn, p.org_id, [corpus_id]):
            raise not_found("corpus")
    return respond({"items": []})  # the engine's vector space is not enabled in this build


ROUTES = [search_records, list_search_profiles, list_vector_spaces]
