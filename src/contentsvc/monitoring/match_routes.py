"""Match routes (part 2 "Saved queries and subscriptions": `GET /v0/matches`, `GET
/v0/matches/{match_id}`, `monitoring:read`; decisions-part2 "Matches"). Only Matches of
Subscriptions whose pinned Corpora the key all grants are seen (rule 8); any other id reads as
absent (404), and an unknown filter value gives an empty page, never 404."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Response
from msgspec import Meta

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.domain.errors import not_found
from contentsvc.domain.models import NonEmpty
from contentsvc.monitoring import matches
from contentsvc.monitoring.matches import Match, MatchPage
from contentsvc.monitoring.shapes import PAGE_DEFAULT, PAGE_MAX

READ = ("monitoring:read",)
MATCH_CURSOR = "matches"


def _scope(call: Call) -> list[str] | None:
    corpora = call.principal.corpora
    return None if corpora is None else sorted(corpora)


class MatchListQuery(Query, kw_only=True):
    subscription_id: NonEmpty | None = None
    record_id: NonEmpty | None = None
    state: Literal["active", "withdrawn"] | None = None
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT


@operation("listMatches", "GET", "/v0/matches", permission=READ, query=MatchListQuery,
           responses={200: MatchPage})
async def list_matches(call: Call[None, MatchListQuery]) -> Response:
    """Ascending id; the cursor is bound to the filters and the key scope (409 cursor_scope_changed)."""
    p, q = call.principal, call.query
    svc = services(call.request)
    binding = {"org": p.org_id, "subscription": q.subscription_id or "*", "record": q.record_id or "*",
               "state": q.state or "*", "scope": p.scope_digest()}
    after = page_after(call.request, q.page_cursor, MATCH_CURSOR, binding, "/v0/matches")
    async with svc.pool.connection() as conn:
        items = await matches.list_matches(conn, p.org_id, _scope(call), q.subscription_id, q.record_id, q.state,
                                           after, q.limit + 1)
    more, items = len(items) > q.limit, items[:q.limit]
    page = MatchPage(items=items)
    if more:
        page.next_page_cursor = svc.cursors.encode(MATCH_CURSOR, after=items[-1].match_id, **binding)
    return respond(page)


@operation("getMatch", "GET", "/v0/matches/{match_id}", permission=READ, responses={200: Match})
async def get_match(call: Call[None, None], match_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        found = await matches.visible_match(conn, call.principal.org_id, _scope(call), match_id)
    if found is None:
        raise not_found("match")
    return respond(found)


ROUTES = [list_matches, get_match]
