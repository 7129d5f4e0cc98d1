"""Routes of the Corpus family: create, list, get (part 1 rules 13, 14)."""

from __future__ import annotations

from litestar import Request, Response, get, post

from contentsvc.commands import corpora as commands
from contentsvc.api.http import (
    authenticate,
    page_after,
    query_int,
    read_json,
    respond,
    services,
)
from contentsvc.config import MAX_INGEST_BYTES
from contentsvc.domain.models import CorpusPage, CorpusRequest
from contentsvc.readmodel.corpora import corpus_or_404, list_corpora, load_corpus

CORPUS_CURSOR = "corpora"
CORPUS_PAGE_MAX = 100


@post("/v0/corpora", operation_id="createCorpus")
async def create_corpus(request: Request) -> Response:
    p = await authenticate(request, "corpora:write")
    req = await read_json(request, CorpusRequest, MAX_INGEST_BYTES)
    async with services(request).pool.connection() as conn:
        corpus_id, replayed = await commands.create_corpus(conn, p, req)
        corpus = await load_corpus(conn, p.org_id, corpus_id)
    return respond(corpus, 200 if replayed else 201, {"Location": f"/v0/corpora/{corpus_id}"})


@get("/v0/corpora", operation_id="listCorpora")
async def list_corpora_route(request: Request) -> Response:
    p = await authenticate(request, "corpora:read")
    limit = query_int(request, "limit", CORPUS_PAGE_MAX, 1, CORPUS_PAGE_MAX)
    svc = services(request)
    binding = {"org": p.org_id, "action": "corpora:read", "scope": p.scope_digest()}
    after = page_after(request, CORPUS_CURSOR, binding, "/v0/corpora")
    async with svc.pool.connection() as conn:
        items = await list_corpora(conn, p, after, limit + 1)  # one more: do more remain?
    more, items = len(items) > limit, items[:limit]
    page = CorpusPage(items=items)
    if more:  # Conventions: next_page_cursor only when more remain
        page.next_page_cursor = svc.cursors.encode(CORPUS_CURSOR, after=items[-1].corpus_id, **binding)
    return respond(page)


@get("/v0/corpora/{corpus_id:str}", operation_id="getCorpus")
async def get_corpus(request: Request, corpus_id: str) -> Response:
    p = await authenticate(request, "corpora:read")
    async with services(request).pool.connection() as conn:
        corpus = await corpus_or_404(conn, p, corpus_id)
    return respond(corpus)


ROUTES = [create_corpus, list_corpora_route, get_corpus]
