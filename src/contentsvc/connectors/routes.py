"""Connector routes (part 2 "Connector management"; decisions-part2 "Create, read, list",
"Commands on a Connector", "Runs"): `connectors:read` for reads, `connectors:write` for the
rest. A Connector of another Organization, or in a Corpus outside the key's scope, is 404."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Response
from msgspec import Meta

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.connectors import commands, instance_tokens, push_store, views
from contentsvc.connectors.kinds import served_kinds
from contentsvc.connectors.shapes import (
    PAGE_DEFAULT,
    PAGE_MAX,
    Connector,
    ConnectorCreate,
    ConnectorKinds,
    ConnectorPage,
    CredentialReplace,
    InstanceToken,
    InstanceTokenCreate,
    InstanceTokenList,
    Run,
    RunAccepted,
    RunPage,
    RunRequest,
    Schedule,
)
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import not_found
from contentsvc.domain.models import ActionRequest, NonEmpty
from contentsvc.storage import sealed

READ = ("connectors:read",)
WRITE = ("connectors:write",)
CONNECTOR_CURSOR, RUN_CURSOR = "connectors", "connector_runs"


async def _view(call: Call, connector_id: str) -> Connector:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        row = await views.visible_connector(conn, call.principal, connector_id)
        if row is None:
            raise not_found("connector")
        served = (await served_kinds(conn, svc.settings)).get(row["kind"])
        push = served.description.push if served else None
        view = views.connector_view(svc.settings, row, relay=bool(push and push.relay))
        if push is not None:
            view.push_counters = await push_store.counters(conn, connector_id)
    return view


@operation("createConnector", "POST", "/v0/connectors", permission=WRITE, body=ConnectorCreate,
           responses={201: Connector, 200: Connector})
async def create_connector(call: Call[ConnectorCreate, None]) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        connector_id, replayed = await commands.create_connector(conn, svc.settings, call.principal, call.body)
    return respond(await _view(call, connector_id), 200 if replayed else 201,
                   {"Location": f"/v0/connectors/{connector_id}"})


class ConnectorListQuery(Query, kw_only=True):
    corpus_id: NonEmpty | None = None
    kind: NonEmpty | None = None
    enabled: Literal["true", "false"] | None = None
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT


@operation("listConnectors", "GET", "/v0/connectors", permission=READ, query=ConnectorListQuery,
           responses={200: ConnectorPage})
async def list_connectors(call: Call[None, ConnectorListQuery]) -> Response:
    """Ascending id, only Connectors in Corpora the key may read; the cursor is bound to the filters."""
    p, q = call.principal, call.query
    svc = services(call.request)
    binding = {"org": p.org_id, "corpus": q.corpus_id or "*", "kind": q.kind or "*", "enabled": q.enabled or "*",
               "scope": p.scope_digest()}
    after = page_after(call.request, q.page_cursor, CONNECTOR_CURSOR, binding, "/v0/connectors")
    async with svc.pool.connection() as conn:
        rows = await views.list_connectors(conn, p, q.corpus_id, q.kind,
                                           None if q.enabled is None else q.enabled == "true", after, q.limit + 1)
        served = await served_kinds(conn, svc.settings)
    more, rows = len(rows) > q.limit, rows[:q.limit]
    relay = {k for k, s in served.items() if s.description.push and s.description.push.relay}
    page = ConnectorPage(items=[views.connector_view(svc.settings, r, r["kind"] in relay) for r in rows])
    if more:
        page.next_page_cursor = svc.cursors.encode(CONNECTOR_CURSOR, after=rows[-1]["connector_id"], **binding)
    return respond(page)


@operation("getConnector", "GET", "/v0/connectors/{connector_id}", permission=READ, responses={200: Connector})
async def get_connector(call: Call[None, None], connector_id: str) -> Response:
    return respond(await _view(call, connector_id))


@operation("disableConnector", "POST", "/v0/connectors/{connector_id}/disable", permission=WRITE,
           body=ActionRequest, body_required=False, responses={200: Connector})
async def disable_connector(call: Call[ActionRequest | None, None], connector_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        await commands.disable_connector(conn, call.principal, connector_id)
    # This process's pushes see the change at once; other API processes when its announcement arrives.
    svc.push_instances.forget(connector_id)
    return respond(await _view(call, connector_id))


@operation("replaceConnectorCredential", "PUT", "/v0/connectors/{connector_id}/credential", permission=WRITE,
           body=CredentialReplace, responses={200: Connector})
async def replace_connector_credential(call: Call[CredentialReplace, None], connector_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        await commands.replace_credential(conn, svc.settings, call.principal, connector_id, call.body)
    svc.push_instances.forget(connector_id)  # as for disableConnector
    return respond(await _view(call, connector_id))


@operation("changeConnectorSchedule", "PUT", "/v0/connectors/{connector_id}/schedule", permission=WRITE,
           body=Schedule, responses={200: Connector},
           # the deployment's floor to a day (part 2 ScheduleChange), also where a create names a schedule
           body_members=lambda settings: {"interval_seconds": {
               "minimum": settings.connectors.interval_floor_seconds, "maximum": commands.MAX_INTERVAL}})
async def change_connector_schedule(call: Call[Schedule, None], connector_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        await commands.change_schedule(conn, svc.settings, call.principal, connector_id, call.body.interval_seconds)
    return respond(await _view(call, connector_id))


@operation("requestConnectorRun", "POST", "/v0/connectors/{connector_id}/runs", permission=WRITE,
           body=RunRequest, responses={202: RunAccepted})
async def request_connector_run(call: Call[RunRequest, None], connector_id: str) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        run = await commands.request_run(conn, svc.settings, call.principal, connector_id, call.body)
    return respond(RunAccepted(connector_id=connector_id, run_id=run["run_id"], run_at=iso(run["run_at"])), 202)


class RunListQuery(Query, kw_only=True):
    state: Literal["queued", "running", "succeeded", "failed", "skipped"] | None = None
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=PAGE_MAX)] = PAGE_DEFAULT


@operation("listConnectorRuns", "GET", "/v0/connectors/{connector_id}/runs", permission=READ,
           query=RunListQuery, responses={200: RunPage})
async def list_connector_runs(call: Call[None, RunListQuery], connector_id: str) -> Response:
    """Newest first; the cursor is bound to the Connector and the state filter."""
    p, q = call.principal, call.query
    svc = services(call.request)
    binding = {"org": p.org_id, "connector": connector_id, "state": q.state or "*", "scope": p.scope_digest()}
    before = page_after(call.request, q.page_cursor, RUN_CURSOR, binding, f"/v0/connectors/{connector_id}/runs")
    async with svc.pool.connection() as conn:
        if await views.visible_connector(conn, p, connector_id) is None:
            raise not_found("connector")
        rows = await views.list_runs(conn, connector_id, q.state, before, q.limit + 1)
    more, rows = len(rows) > q.limit, rows[:q.limit]
    page = RunPage(items=[views.run_view(r) for r in rows])
    if more:
        page.next_page_cursor = svc.cursors.encode(RUN_CURSOR, after=rows[-1]["run_id"], **binding)
    return respond(page)


@operation("getConnectorRun", "GET", "/v0/connectors/{connector_id}/runs/{run_id}", permission=READ,
           responses={200: Run})
async def get_connector_run(call: Call[None, None], connector_id: str, run_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        if await views.visible_connector(conn, call.principal, connector_id) is None:
            raise not_found("connector")
        row = await views.run_row(conn, connector_id, run_id)
    if row is None:
        raise not_found("run")
    return respond(views.run_view(row))


@operation("listConnectorKinds", "GET", "/v0/connector-kinds", permission=READ, responses={200: ConnectorKinds})
async def list_connector_kinds(call: Call[None, None]) -> Response:
    svc = services(call.request)
    async with svc.pool.connection() as conn:
        served = await served_kinds(conn, svc.settings)
    return respond({"items": [s.catalog_entry() for s in served.values()],
                    "credential_deposits": sealed.can_seal(svc.settings)})


@operation("createInstanceToken", "POST", "/v0/connectors/{connector_id}/instance-tokens", permission=WRITE,
           body=InstanceTokenCreate, responses={201: InstanceToken, 200: InstanceToken})
async def create_instance_token(call: Call[InstanceTokenCreate, None], connector_id: str) -> Response:
    """The secret is in this answer only; a replay answers 200 without it."""
    async with services(call.request).pool.connection() as conn:
        token, replayed = await instance_tokens.create_token(conn, call.principal, connector_id, call.body)
    return respond(token, 200 if replayed else 201)


@operation("listInstanceTokens", "GET", "/v0/connectors/{connector_id}/instance-tokens", permission=READ,
           responses={200: InstanceTokenList})
async def list_instance_tokens(call: Call[None, None], connector_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        return respond(InstanceTokenList(items=await instance_tokens.list_tokens(conn, call.principal, connector_id)))


@operation("revokeInstanceToken", "POST", "/v0/connectors/{connector_id}/instance-tokens/{token_id}/revoke",
           permission=WRITE, body=ActionRequest, body_required=False, responses={200: InstanceToken})
async def revoke_instance_token(call: Call[ActionRequest | None, None], connector_id: str, token_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        return respond(await instance_tokens.revoke_token(conn, call.principal, connector_id, token_id))


ROUTES = [create_connector, list_connectors, get_connector, disable_connector, replace_connector_credential,
          change_connector_schedule, request_connector_run, list_connector_runs, get_connector_run,
          list_connector_kinds, create_instance_token, list_instance_tokens, revoke_instance_token]
