"""Saved Query and Subscription routes (part 2 "Saved queries and subscriptions": `monitoring:read`
for reads, `monitoring:write` for writes; decisions-part2 "Monitoring" > "Saved queries",
"Subscriptions"). Creates answer 201 with a Location, a replay 200; an id outside the key's
scope reads as absent (404), like an unknown one."""

from __future__ import annotations

from typing import Annotated

from litestar import Response
from msgspec import Meta

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.domain.errors import not_found
from contentsvc.domain.models import ActionRequest, NonEmpty
from contentsvc.monitoring import commands, views
from contentsvc.monitoring.shapes import (
    GLOBAL_OWNER,
    PAGE_DEFAULT,
    PAGE_MAX,
    RenameRequest,
    SavedQuery,
    SavedQueryCreate,
    SavedQueryVersion,
    SavedQueryVersionCreate,
    Subscription,
    SubscriptionCreate,
    SubscriptionPage,
    SubscriptionVersion,
    SubscriptionVersionCreate,
    check_owner,
)

READ = ("monitoring:read",)
WRITE = ("monitoring:write",)
SUBSCRIPTION_CURSOR = "subscriptions"


# ---------------------------------------------------------------- Saved Queries


async def _saved_query(call: Call, saved_query_id: str) -> SavedQuery:
    async with services(call.request).pool.connection() as conn:
        head = await views.visible_saved_query(conn, call.principal, saved_query_id)
    if head is None:
        raise not_found("saved query")
    return head.view()


@operation("createSavedQuery", "POST", "/v0/saved-queries", permission=WRITE, body=SavedQueryCreate,
           responses={201: SavedQuery, 200: SavedQuery})
async def create_saved_query(call: Call[SavedQueryCreate, None]) -> Response:
    async with services(call.request).pool.connection() as conn:
        saved_query_id, replayed = await commands.create_saved_query(conn, call.principal, call.body)
    return respond(await _saved_query(call, saved_query_id), 200 if replayed else 201,
                   {"Location": f"/v0/saved-queries/{saved_query_id}"})


@operation("getSavedQuery", "GET", "/v0/saved-queries/{saved_query_id}", permission=READ,
           responses={200: SavedQuery})
async def get_saved_query(call: Call[None, None], saved_query_id: str) -> Response:
    return respond(await _saved_query(call, saved_query_id))


async def _saved_query_version(call: Call, saved_query_id: str, version_id: str) -> SavedQueryVersion:
    async with services(call.request).pool.connection() as conn:
        found = await views.visible_saved_query_version(conn, call.principal, saved_query_id, version_id)
    if found is None:
        raise not_found("saved query version")
    return found


@operation("getSavedQueryVersion", "GET", "/v0/saved-queries/{saved_query_id}/versions/{version_id}",
           permission=READ, responses={200: SavedQueryVersion})
async def get_saved_query_version(call: Call[None, None], saved_query_id: str, version_id: str) -> Response:
    return respond(await _saved_query_version(call, saved_query_id, version_id))


@operation("createSavedQueryVersion", "POST", "/v0/saved-queries/{saved_query_id}/versions", permission=WRITE,
           body=SavedQueryVersionCreate, responses={201: SavedQueryVersion, 200: SavedQueryVersion})
async def create_saved_query_version(call: Call[SavedQueryVersionCreate, None], saved_query_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        version_id, replayed = await commands.create_saved_query_version(conn, call.principal, saved_query_id,
                                                                         call.body)
    return respond(await _saved_query_version(call, saved_query_id, version_id), 200 if replayed else 201,
                   {"Location": f"/v0/saved-queries/{saved_query_id}/versions/{version_id}"})


@operation("deleteSavedQuery", "POST", "/v0/saved-queries/{saved_query_id}/delete", permission=WRITE,
           body=ActionRequest, body_required=False, responses={200: SavedQuery})
async def delete_saved_query(call: Call[ActionRequest | None, None], saved_query_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        await commands.delete_saved_query(conn, call.principal, saved_query_id)
    return respond(await _saved_query(call, saved_query_id))


@operation("renameSavedQuery", "POST", "/v0/saved-queries/{saved_query_id}/rename", permission=WRITE,
           body=RenameRequest, responses={200: SavedQuery})
async def rename_saved_query(call: Call[RenameRequest, None], saved_query_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        await commands.rename_saved_query(conn, call.principal, saved_query_id, call.body)
    return respond(await _saved_query(call, saved_query_id))


# ---------------------------------------------------------------- Subscriptions


async def _subscription(call: Call, subscription_id: str) -> Subscription:
    async with services(call.request).pool.connection() as conn:
        head = await views.visible_subscription(conn, call.principal, subscription_id)
    if head is None:
        raise not_found("subscription")
    return head.view()


class SubscriptionListQuery(Query, kw_only=True):
    owner: Annotated[str, Meta(min_length=1)] | None = None  # a value, or `none` for global Subscriptions
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT


@operation("listSubscriptions", "GET", "/v0/subscriptions", permission=READ, query=SubscriptionListQuery,
           responses={200: SubscriptionPage})
async def list_subscriptions(call: Call[None, SubscriptionListQuery]) -> Response:
    """rule 5: active Subscriptions of one owner, or global ones with owner=none, in id order; the
    cursor is bound to the owner filter and the key scope (409 cursor_scope_changed)."""
    p, owner, limit = call.principal, call.query.owner, call.query.limit
    global_only = owner == GLOBAL_OWNER
    if owner is not None and not global_only:
        check_owner(owner)
    svc = services(call.request)
    binding = {"org": p.org_id, "owner": "*" if owner is None else owner, "scope": p.scope_digest()}
    after = page_after(call.request, call.query.page_cursor, SUBSCRIPTION_CURSOR, binding, "/v0/subscriptions")
    async with svc.pool.connection() as conn:
        items = await views.active_subscriptions(conn, p, None if global_only else owner, global_only, after,
                                                 limit + 1)
    more, items = len(items) > limit, items[:limit]
    page = SubscriptionPage(items=items)
    if more:
        page.next_page_cursor = svc.cursors.encode(SUBSCRIPTION_CURSOR, after=items[-1].subscription_id, **binding)
    return respond(page)


@operation("createSubscription", "POST", "/v0/subscriptions", permission=WRITE, body=SubscriptionCreate,
           responses={201: Subscription, 200: Subscription})
async def create_subscription(call: Call[SubscriptionCreate, None]) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        subscription_id, replayed = await commands.create_subscription(conn, svc.settings, call.principal, call.body)
    return respond(await _subscription(call, subscription_id), 200 if replayed else 201,
                   {"Location": f"/v0/subscriptions/{subscription_id}"})


@operation("getSubscription", "GET", "/v0/subscriptions/{subscription_id}", permission=READ,
           responses={200: Subscription})
async def get_subscription(call: Call[None, None], subscription_id: str) -> Response:
    return respond(await _subscription(call, subscription_id))


async def _subscription_version(call: Call, subscription_id: str, version_id: str) -> SubscriptionVersion:
    async with services(call.request).pool.connection() as conn:
        found = await views.visible_subscription_version(conn, call.principal, subscription_id, version_id)
    if found is None:
        raise not_found("subscription version")
    return found


@operation("getSubscriptionVersion", "GET", "/v0/subscriptions/{subscription_id}/versions/{version_id}",
           permission=READ, responses={200: SubscriptionVersion})
async def get_subscription_version(call: Call[None, None], subscription_id: str, version_id: str) -> Response:
    return respond(await _subscription_version(call, subscription_id, version_id))


@operation("createSubscriptionVersion", "POST", "/v0/subscriptions/{subscription_id}/versions", permission=WRITE,
           body=SubscriptionVersionCreate, responses={201: SubscriptionVersion, 200: SubscriptionVersion})
async def create_subscription_version(call: Call[SubscriptionVersionCreate, None], subscription_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        version_id, replayed = await commands.create_subscription_version(conn, svc.settings, call.principal,
                                                                          subscription_id, call.body)
    return respond(await _subscription_version(call, subscription_id, version_id), 200 if replayed else 201,
                   {"Location": f"/v0/subscriptions/{subscription_id}/versions/{version_id}"})


@operation("deleteSubscription", "POST", "/v0/subscriptions/{subscription_id}/delete", permission=WRITE,
           body=ActionRequest, body_required=False, responses={200: Subscription})
async def delete_subscription(call: Call[ActionRequest | None, None], subscription_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        await commands.delete_subscription(conn, call.principal, subscription_id)
    return respond(await _subscription(call, subscription_id))


@operation("disableSubscription", "POST", "/v0/subscriptions/{subscription_id}/disable", permission=WRITE,
           body=ActionRequest, body_required=False, responses={200: Subscription})
async def disable_subscription(call: Call[ActionRequest | None, None], subscription_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        await commands.set_enabled(conn, svc.settings, call.principal, subscription_id, False)
    return respond(await _subscription(call, subscription_id))


@operation("enableSubscription", "POST", "/v0/subscriptions/{subscription_id}/enable", permission=WRITE,
           body=ActionRequest, body_required=False, responses={200: Subscription})
async def enable_subscription(call: Call[ActionRequest | None, None], subscription_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        await commands.set_enabled(conn, svc.settings, call.principal, subscription_id, True)
    return respond(await _subscription(call, subscription_id))


@operation("renameSubscription", "POST", "/v0/subscriptions/{subscription_id}/rename", permission=WRITE,
           body=RenameRequest, responses={200: Subscription})
async def rename_subscription(call: Call[RenameRequest, None], subscription_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        await commands.rename_subscription(conn, call.principal, subscription_id, call.body)
    return respond(await _subscription(call, subscription_id))


ROUTES = [create_saved_query, get_saved_query, get_saved_query_version, create_saved_query_version,
          delete_saved_query, rename_saved_query, list_subscriptions, create_subscription, get_subscription,
          get_subscription_version, create_subscription_version, delete_subscription, disable_subscription,
          enable_subscription, rename_subscription]
