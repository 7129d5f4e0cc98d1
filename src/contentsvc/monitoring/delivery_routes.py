"""Delivery routes (part 2 endpoints table: getDelivery, listDeliveryAttempts, `monitoring:read`;
decisions-part2 "Deliveries": the Delivery and Attempt fields, attempts in ascending `number`).

Authorization is part 2 rule 8: a Delivery is read with grants on every Corpus any Version of its
Subscription pinned. A Delivery of another Organization, or of a Subscription the key does not
fully see, reads as absent (404 not_found), like an unknown id.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response
from msgspec import Meta
from psycopg import AsyncConnection

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.auth.principal import Principal
from contentsvc.domain.errors import not_found
from contentsvc.domain.models import NonEmpty, Output
from contentsvc.monitoring import deliveries, views
from contentsvc.monitoring.deliveries import Attempt, Delivery
from contentsvc.monitoring.shapes import PAGE_DEFAULT, PAGE_MAX

READ = ("monitoring:read",)
ATTEMPT_CURSOR = "delivery_attempts"


class DeliveryAttemptPage(Output, kw_only=True):
    items: list[Attempt]
    next_page_cursor: str | None = None


class AttemptListQuery(Query, kw_only=True):
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT


async def _visible_delivery(conn: AsyncConnection, p: Principal, delivery_id: str) -> Delivery:
    """rule 8: the Delivery of a Subscription of the key's Organization whose every pinned Corpus
    (over all its Versions) the key grants; else 404."""
    found = await deliveries.get_delivery(conn, delivery_id)
    if found is None:
        raise not_found("delivery")
    org_id, _, delivery = found
    if org_id != p.org_id or await views.visible_subscription(conn, p, delivery.subscription_id) is None:
        raise not_found("delivery")
    return delivery


@operation("getDelivery", "GET", "/v0/deliveries/{delivery_id}", permission=READ, responses={200: Delivery})
async def get_delivery(call: Call[None, None], delivery_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        return respond(await _visible_delivery(conn, call.principal, delivery_id))


@operation("listDeliveryAttempts", "GET", "/v0/deliveries/{delivery_id}/attempts", permission=READ,
           query=AttemptListQuery, responses={200: DeliveryAttemptPage})
async def list_delivery_attempts(call: Call[None, AttemptListQuery], delivery_id: str) -> Response:
    """decisions-part2 "Deliveries": ascending `number`; the cursor is bound to the Delivery and the
    key's scope (409 cursor_scope_changed otherwise), like listSubscriptions'."""
    p, limit, svc = call.principal, call.query.limit, services(call.request)
    resync_url = f"/v0/deliveries/{delivery_id}/attempts"
    async with svc.pool.connection() as conn:
        await _visible_delivery(conn, p, delivery_id)  # 404 before any cursor check: nothing leaks
        binding = {"org": p.org_id, "delivery": delivery_id, "scope": p.scope_digest()}
        after = page_after(call.request, call.query.page_cursor, ATTEMPT_CURSOR, binding, resync_url)
        items = await deliveries.list_attempts(conn, delivery_id, int(after or 0), limit + 1)
    more, items = len(items) > limit, items[:limit]
    page = DeliveryAttemptPage(items=items)
    if more:
        page.next_page_cursor = svc.cursors.encode(ATTEMPT_CURSOR, after=str(items[-1].number), **binding)
    return respond(page)


ROUTES = [get_delivery, list_delivery_attempts]
