"""Plugin administration routes (part 2 "Plugin administration"; decisions-part2 "Registration
request", "Activation, plans, rollback"): `plugins:admin`, an operator action organization keys
never hold (403 forbidden); the active-plugins listing needs `observability:read` on a key
granting every Corpus and names no address, configuration, manifest or digest."""

from __future__ import annotations

from typing import Annotated

from litestar import Response
from msgspec import Meta

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.domain.errors import forbidden, not_found
from contentsvc.plugins import commands, registry
from contentsvc.plugins.shapes import (
    MAX_REGISTRATION_BODY_BYTES,
    ActivationRequest,
    ActivePlugin,
    ActivePlugins,
    PipelinePlan,
    PipelinePlanPage,
    PluginRegistration,
    PluginRegistrationDetail,
    PluginRegistrationList,
    RegistrationRequest,
    RollbackRequest,
)

ADMIN = ("plugins:admin",)
PLAN_CURSOR = "plugin_plans"
PLAN_PAGE_MAX = 100
PLAN_PAGE_DEFAULT = 20


@operation("registerPlugin", "POST", "/v0/admin/plugins", permission=ADMIN, body=RegistrationRequest,
           body_limit=MAX_REGISTRATION_BODY_BYTES, responses={202: PluginRegistration})
async def register_plugin(call: Call[RegistrationRequest, None]) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        found, _replayed = await commands.register(conn, svc.settings, call.body)
    return respond(found.view(), 202, {"Location": f"/v0/admin/plugins/{found.registration_id}"})


@operation("listPlugins", "GET", "/v0/admin/plugins", permission=ADMIN, responses={200: PluginRegistrationList})
async def list_plugins(call: Call[None, None]) -> Response:
    async with services(call.request).pool.connection() as conn:
        found = await registry.registrations(conn)
    return respond(PluginRegistrationList(items=[r.view() for r in found]))


@operation("getActivePlan", "GET", "/v0/admin/plugins/plan", permission=ADMIN, responses={200: PipelinePlan})
async def get_active_plan(call: Call[None, None]) -> Response:
    async with services(call.request).pool.connection() as conn:
        plan = await registry.active_plan(conn)
    if plan is None or not plan.roles:
        raise not_found("active plan: no plugin is pinned")
    return respond(plan.view())


class PlanListQuery(Query, kw_only=True):
    page_cursor: Annotated[str, Meta(min_length=1)] | None = None
    limit: Annotated[int, Meta(ge=1, le=PLAN_PAGE_MAX)] = PLAN_PAGE_DEFAULT


@operation("listPlans", "GET", "/v0/admin/plugins/plans", permission=ADMIN, query=PlanListQuery,
           responses={200: PipelinePlanPage})
async def list_plans(call: Call[None, PlanListQuery]) -> Response:
    svc, limit = services(call.request), call.query.limit
    binding = {"scope": "deployment"}
    after = page_after(call.request, call.query.page_cursor, PLAN_CURSOR, binding, "/v0/admin/plugins/plans")
    async with svc.pool.connection() as conn:
        found = await registry.plans_page(conn, None if after is None else int(after), limit + 1)
    more, found = len(found) > limit, found[:limit]
    page = PipelinePlanPage(items=[plan.view() for _, plan in found])
    if more:
        page.next_page_cursor = svc.cursors.encode(PLAN_CURSOR, after=str(found[-1][0]), **binding)
    return respond(page)


@operation("getPlan", "GET", "/v0/admin/plugins/plans/{plan_id}", permission=ADMIN, responses={200: PipelinePlan})
async def get_plan(call: Call[None, None], plan_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        plan = await registry.plan(conn, plan_id)
    if plan is None:
        raise not_found("plan")
    return respond(plan.view())


@operation("rollbackPlan", "POST", "/v0/admin/plugins/plan/rollback", permission=ADMIN, body=RollbackRequest,
           responses={200: PipelinePlan})
async def rollback_plan(call: Call[RollbackRequest, None]) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        plan = await commands.rollback(conn, svc.settings, call.body)
    return respond(plan.view())


@operation("getPlugin", "GET", "/v0/admin/plugins/{registration_id}", permission=ADMIN,
           responses={200: PluginRegistrationDetail})
async def get_plugin(call: Call[None, None], registration_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        found = await registry.registration(conn, registration_id)
        if found is None:
            raise not_found("plugin registration")
        pinned = await registry.pinned_work(conn, registration_id)
    return respond(found.detail(pinned))


@operation("activatePlugin", "POST", "/v0/admin/plugins/{registration_id}/activate", permission=ADMIN,
           body=ActivationRequest, responses={200: PipelinePlan})
async def activate_plugin(call: Call[ActivationRequest, None], registration_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        plan = await commands.activate(conn, svc.settings, registration_id, call.body)
    return respond(plan.view())


@operation("listActivePlugins", "GET", "/v0/admin/active-plugins", permission=("observability:read",),
           responses={200: ActivePlugins})
async def list_active_plugins(call: Call[None, None]) -> Response:
    if call.principal.corpora is not None:
        raise forbidden("The active-plugins listing needs a key granting every Corpus.")
    async with services(call.request).pool.connection() as conn:
        plan = await registry.active_plan(conn)
    if plan is None:
        return respond(ActivePlugins(items=[]))
    served: dict[tuple[str, str], list[str]] = {}
    for role in plan.roles:
        served.setdefault((role.plugin_id, role.version), []).append(role.role)
    return respond(ActivePlugins(items=[ActivePlugin(plugin_id=p, version=v, roles=sorted(r))
                                        for (p, v), r in sorted(served.items())],
                                 plan_activated_at=plan.activated_at))


ROUTES = [register_plugin, list_plugins, get_active_plan, list_plans, get_plan, rollback_plan, get_plugin,
          activate_plugin, list_active_plugins]
