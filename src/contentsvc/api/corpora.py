"""Routes of the Corpus family: create, list, get (part 1 rules 13, 14)."""

from __future__ import annotations

from typing import Annotated

from litestar import Response
from msgspec import Meta

from contentsvc.commands import corpora as commands
from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.domain.cursors import resync_url
from contentsvc.domain.models import Corpus, CorpusPage, CorpusRequest, NonEmpty
from contentsvc.readmodel.corpora import corpus_or_404, list_corpora, load_corpus

CORPUS_CURSOR = "corpora"
CORPUS_PAGE_MAX = 100


@operation("createCorpus", "POST", "/v0/corpora", permission=("corpora:write",), body=CorpusRequest,
           responses={201: Corpus, 200: Corpus})
async def create_corpus(call: Call[CorpusRequest, None]) -> Response:
    p = call.principal
    async with services(call.request).pool.connection() as conn:
        corpus_id, replayed = await commands.create_corpus(conn, p, call.body)
        corpus = await load_corpus(conn, p.org_id, corpus_id)
    return respond(corpus, 200 if replayed else 201, {"Location": f"/v0/corpora/{corpus_id}"})


class CorpusListQuery(Query, kw_only=True):
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=CORPUS_PAGE_MAX)] = CORPUS_PAGE_MAX


@operation("listCorpora", "GET", "/v0/corpora", permission=("corpora:read",), query=CorpusListQuery,
           responses={200: CorpusPage})
async def list_corpora_route(call: Call[None, CorpusListQuery]) -> Response:
    p, limit = call.principal, call.query.limit
    svc = services(call.request)
    binding = {"org": p.org_id, "action": "corpora:read", "scope": p.scope_digest()}
    after = page_after(call.request, call.query.page_cursor, CORPUS_CURSOR, binding, resync_url())
    async with svc.pool.connection() as conn:
        items = await list_corpora(conn, p, after, limit + 1)  # one more: do more remain?
    more, items = len(items) > limit, items[:limit]
    page = CorpusPage(items=items)
    if more:  # Conventions: next_page_cursor only when more remain
        page.next_page_cursor = svc.cursors.encode(CORPUS_CURSOR, after=items[-1].corpus_id, **binding)
    return respond(page)


@operation("getCorpus", "GET", "/v0/corpora/{corpus_id}", permission=("corpora:read",), responses={200: Corpus})
async def get_corpus(call: Call[None, None], corpus_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        corpus = await corpus_or_404(conn, call.principal, corpus_id)
    return respond(corpus)


ROUTES = [create_corpus, list_corpora_route, get_corpus]
