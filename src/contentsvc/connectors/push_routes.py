"""A Connector's push routes and webhook relay (part 2 "Webhook relay", "Declared push route" rules
1-13; decisions-part2 "Push routes, relay, push_policy, proxies", "Built-in `fixture` kind").

Guards run in the contract's order, each refusing before anything later is tried: the instance
(404), the route and method (404, 405 with Allow), sizes (413), `allowed_cidrs` (403), the key or
instance token (401/403), JSON and the route's `request_schema` (400/422), the idempotency replay,
the token bucket (429 with Retry-After, before any plugin call), the signature and its fingerprint
reservations (401/409), then the plugin (or the built-in fixture kind) and ingestion within 9 s.
Every attempt on an existing Connector commits its audit event and counters before the answer
leaves. Items converge with pull runs on the same Receipts (keys `con:{id}:{record_key}:{revision}`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from litestar import Request, Response
from psycopg.types.json import Jsonb

from contentsvc.api.http import Services, cached_principal, read_body, services
from contentsvc.api.routes import Call, Stream, operation
from contentsvc.auth.principal import bearer_secret
from contentsvc.commands.records import Accepted
from contentsvc.config.plugins import HEADER_NAME
from contentsvc.connectors import instance_tokens, push_store, views
from contentsvc.connectors.commands import connector_principal, item_commands
from contentsvc.connectors.credentials import open_credential
from contentsvc.connectors.kinds import ServedKind, served_kinds
from contentsvc.connectors.pages import fixture_item, is_fixture_item
from contentsvc.connectors.push_ingests import PushedItems, PushIngests
from contentsvc.connectors.push_guards import (
    MAX_BODY_BYTES,
    RateLimits,
    check_allowed,
    check_idempotency_key,
    check_signature,
    check_sizes,
    client_address,
    relayed_headers,
    resolve_route,
)
from contentsvc.connectors.shapes import PushAccepted
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.logging import get_logger
from contentsvc.plugins.client import ROUTE_CLIENTS, PluginUnreachable, plugin_error
from contentsvc.plugins.manifest import PushRoute, validate_against
from contentsvc.readmodel.receipts import answer_receipts
from contentsvc.storage import sealed
from contentsvc.storage.notified_cache import NotifiedCache

log = get_logger("contentsvc.connectors.push")

STAGE_SECONDS = 9.0  # rule 6: plugin and ingestion
RELAY = "relay"
PLUGIN_ORIGIN = {"Service-Response-Origin": "plugin"}
RATE_LIMITS = RateLimits()  # per API process (decisions-part2: N processes allow N times the rate)

PUSH_BODY = Stream("application/json", "Any JSON, checked against the declared route's request_schema.")
RELAY_BODY = Stream("*/*", "The source's request, relayed to the connector plugin as it came.")
Relayed = tuple[int, dict[str, str], bytes]  # the answer a plugin gives the source: status, headers, body


@dataclass
class Attempt:
    """What the audit of one attempt names."""

    connector: dict[str, Any]
    route: str
    method: str
    client_ip: str
    counter: str | None = None
    recorded: bool = False  # its audit committed with its items (connectors/push_ingests.py)

    def audit_entry(self, status: int, code: str | None) -> push_store.Attempt:
        row = self.connector
        return push_store.Attempt(row["connector_id"], row["org_id"], row["corpus_id"], self.route, self.method,
                                  status, code, self.client_ip, self.counter)


class PluginVerdict(Exception):
    """The plugin refused: its status, content type and body go back unchanged."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        super().__init__(status)
        self.status, self.content_type, self.body = status, content_type, body


def _plugin_unavailable() -> ApiError:
    return ApiError(503, "plugin_unavailable", "The connector plugin is unreachable; retry later.", retryable=True,
                    headers={"Retry-After": "5"})


# What a push reads of its Connector and kind, kept by each API process while its listening
# connection hears of their changes (storage/notified_cache.py): a trigger announces a change to
# a Connector on CONNECTORS_CHANNEL, a new plan on PLANS_CHANNEL (schema/026).
CONNECTORS_CHANNEL = "contentsvc_connectors"
PLANS_CHANNEL = "contentsvc_plans"
PushInstances = NotifiedCache[str, tuple[dict[str, Any], ServedKind]]


async def _instance(svc: Services, connector_id: str) -> tuple[dict[str, Any], ServedKind]:
    """The Connector and its kind, when it exists and its kind declares push; else 404. The row is
    shared with other requests: read, never changed."""
    async def read(connector_id: str) -> tuple[dict[str, Any], ServedKind] | None:
        async with svc.pool.connection() as conn:
            row = await views.connector_row(conn, connector_id)
            served = (await served_kinds(conn, svc.settings)).get(row["kind"]) if row is not None else None
        return None if row is None or served is None else (row, served)

    found = await svc.push_instances.get(connector_id, read)
    if found is None or found[1].description.push is None:
        raise not_found("connector")
    return found


async def _authorize(pool, request: Request, row: dict[str, Any], route: PushRoute) -> None:
    """rule 2: a service key with connector:push on the instance's Corpus, or this instance's token."""
    secret = bearer_secret(request.headers.get("authorization"))
    if route.auth == "instance_token":
        async with pool.connection() as conn:
            granted = await instance_tokens.token_grants(conn, row["connector_id"], secret)
        if not granted:
            raise ApiError(401, "invalid_instance_token", "This route needs a live instance token of this Connector.")
        return
    principal = await cached_principal(request, secret) if secret else None
    if principal is None:
        raise ApiError(401, "invalid_api_key", "A valid API key is required (Authorization: Bearer <key>).")
    if principal.org_id != row["org_id"] or not principal.covers(row["corpus_id"]):
        raise not_found("connector")
    principal.require("connector:push")


def _json_body(raw: bytes, route: PushRoute) -> Any:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise ApiError(400, "malformed_json", "The body is not JSON.") from None
    issues = validate_against(route.request_schema, body)
    if issues:
        raise ApiError(422, "invalid_schema", f"The body does not satisfy the route's request_schema: "
                                              f"{issues[0].message}", field=issues[0].pointer or "/")
    return body


async def _receive(settings, served: ServedKind, row: dict[str, Any], route_name: str, request: Request,
                   raw: bytes, route: PushRoute | None, timeout: float) -> tuple[Relayed, list[dict]]:
    """The plugin's (or the fixture kind's) answer to one relayed request: (its response, items)."""
    credential = open_credential(settings, row["connector_id"], row["credential_version"], row["credential"])
    if served.provider is None:
        return _fixture_receive(row, credential, route_name, route, request, raw)
    provider = served.provider
    client = ROUTE_CLIENTS.client(provider.target)
    body = {**served.call_body(row, credential, settings.connectors.public_base_url), "route": route_name,
            "request": {"method": request.method, "path": request.url.path, "query": request.url.query or "",
                        "headers": relayed_headers(list(request.headers.items())),
                        "body_base64": base64.b64encode(raw).decode()}}
    try:
        answer = await client.relay("connector/receive", body, timeout)
    except PluginUnreachable:
        raise _plugin_unavailable() from None
    if answer.status_code >= 500:
        error = plugin_error(answer.status_code, _json(answer.content))
        if error is not None and error.error_class in ("access", "source"):
            raise ApiError(500, "push_failed", f"The connector plugin reported a {error.error_class} error: "
                                               f"{error.code}.")
        raise _plugin_unavailable()
    if not 200 <= answer.status_code < 300:
        raise PluginVerdict(answer.status_code, answer.headers.get("content-type", "application/octet-stream"),
                            answer.content)
    decoded = _json(answer.content)
    relayed = relayed_response(decoded.get("response")) if isinstance(decoded, dict) else None
    if relayed is None or not isinstance(decoded.get("items", []), list):
        raise _plugin_unavailable()
    return relayed, decoded.get("items", [])


def _json(raw: bytes) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def _fixture_receive(row: dict[str, Any], credential: dict | None, route_name: str, route: PushRoute | None,
                     request: Request, raw: bytes) -> tuple[Relayed, list[dict]]:
    """The built-in fixture kind's side of a push: `signed` checks hex HMAC-SHA256(token, raw body);
    a GET challenge is answered with its `challenge` query parameter; DELETE withdraws the items."""
    error = row["config"].get("error")
    if error:
        if error["error_class"] == "transient":
            raise _plugin_unavailable()
        raise ApiError(500, "push_failed", f"The fixture configuration fails every push ({error['code']}).")
    if request.method == "GET":
        return (200, {"content-type": "text/plain"}, request.query_params.get("challenge", "").encode()), []
    if route is not None and route.auth == "signature":
        token = (credential or {}).get("token", "")
        expected = hmac.new(token.encode(), raw, hashlib.sha256).hexdigest()
        if not token or not hmac.compare_digest(expected, request.headers.get(route.signature_header, "")):
            raise PluginVerdict(401, "application/json", b'{"code":"bad_signature","message":"signature mismatch",'
                                                         b'"retryable":false}')
    body = _json(raw)
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise PluginVerdict(400, "application/json", b'{"code":"bad_request","message":"expected {items: [...]}",'
                                                     b'"retryable":false}')
    if request.method == "DELETE":
        items = [{**i, "withdraw": True} if isinstance(i, dict) else i for i in items]
    # An entry that is not a fixture item goes on as {}, which ingestion refuses: 422 item_rejected (rule 7).
    return (200, {}, b""), [fixture_item(i, n) if is_fixture_item(i) else {} for n, i in enumerate(items)]


async def _ingest(pool, ingests: PushIngests, served: ServedKind, row: dict[str, Any], items: list[dict],
                  attempt: Attempt | None) -> list[dict]:
    """The items through the ingestion path; their Receipts in item order (rule 7: a refused item is
    422 item_rejected, while the others may already be accepted). They go through the push group
    commit, ingests and withdrawals in their order, so concurrent pushes to a Connector share a
    transaction, which also records `attempt` as received (202) when every item is accepted."""
    principal = connector_principal(row)
    commands = item_commands(served, row, items)
    received = attempt.audit_entry(202, None) if attempt is not None else None
    delivered = await ingests.accept(principal, PushedItems(commands, received))
    results = delivered.results
    if delivered.audited:
        attempt.recorded = True
    refused = next((r for r in results if isinstance(r, ApiError)), None)
    if refused is not None:
        raise ApiError(422, "item_rejected", f"An item was refused: {refused.code}: {refused.message}")
    answered = [(r, c) for r, c in zip(results, commands) if isinstance(r, Accepted)]
    receipts = await answer_receipts(pool, principal, answered)
    return [msgspec.to_builtins(receipts[r.receipt_id]) for r, _ in answered]


def _push_active(row: dict[str, Any]) -> bool:
    return ((row["health"] or {}).get("push") or {}).get("state") == "active"


async def _mark_push_active(pool, row: dict[str, Any]) -> None:
    """health.push becomes `active` at the first accepted push (written once, not at every push)."""
    if _push_active(row):
        return
    moved = {"state": "active", "last_delivery_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # Concurrent first pushes all see the cached row inactive: the first UPDATE writes, the others
    # find it active and change nothing (no announcement, so the cached row is dropped once).
    async with pool.connection() as conn, conn.transaction():  # only health.push: the worker may write the rest
        await conn.execute("UPDATE connectors SET health = jsonb_set(health, '{push}',"
                           " (coalesce(health->'push', '{}'::jsonb) - 'error') || %s) WHERE connector_id = %s"
                           " AND health->'push'->>'state' IS DISTINCT FROM 'active'",
                           (Jsonb(moved), row["connector_id"]))


async def _audited(audit: push_store.PushAudit, attempt: Attempt, work) -> Response:
    """Runs the guarded work; its answer, or its refusal, is audited before it leaves."""
    try:
        response = await work()
    except ApiError as refusal:
        await _record(audit, attempt, refusal.status, refusal.code)
        raise
    except PluginVerdict as verdict:
        response = Response(verdict.body, status_code=verdict.status, media_type=verdict.content_type,
                            headers=dict(PLUGIN_ORIGIN) if attempt.route != RELAY else None)
    await _record(audit, attempt, response.status_code, None if 200 <= response.status_code < 300 else "plugin_refused")
    return response


async def _record(audit: push_store.PushAudit, attempt: Attempt, status: int, code: str | None) -> None:
    row = attempt.connector
    if not attempt.recorded:
        await audit.record(attempt.audit_entry(status, code))
    log.info("connector_push", connector_id=row["connector_id"], route=attempt.route, status=status, code=code,
             client_ip=attempt.client_ip)


def _client_ip(request: Request, settings) -> str:
    peer = request.client.host if request.client else None
    return client_address(peer, request.headers.get("x-forwarded-for"), settings.connectors.trusted_proxies)


async def _push(call: Call[None, None], connector_id: str, path: str) -> Response:
    """One request on a declared route, whatever its method: POST, PUT, PATCH and DELETE carry JSON
    items; GET (a source's challenge) carries none and gets the plugin's own answer back."""
    request = call.request
    svc = services(request)
    settings = svc.settings
    client_ip = _client_ip(request, settings)
    challenge = request.method == "GET"
    # Each step borrows a connection for itself alone: none is held across the plugin call or while
    # the items wait for their group commit, which takes connections of its own.
    pool = svc.pool
    row, served = await _instance(svc, connector_id)
    attempt = Attempt(row, "unknown", request.method, client_ip)

    async def work() -> Response:
        if not row["enabled"]:
            raise not_found("connector")
        route = resolve_route(served.description.push.routes, path, request.method)
        attempt.route = route.name
        raw = await read_body(request, MAX_BODY_BYTES)
        check_sizes(len(raw), request.url.query or "")
        check_allowed(client_ip, (row["push_policy"] or {}).get("allowed_cidrs"))
        if route.auth != "signature":
            await _authorize(pool, request, row, route)
        if challenge:  # rule 12: GET challenges bypass the signature guards; nothing to replay
            _take_token(attempt, row)
            return _plugin_answer(await _bounded(_deliver(pool, settings, served, row, route, request, raw)))
        _json_body(raw, route)
        key = check_idempotency_key(request.headers.get("idempotency-key"))
        replayable = key is not None and route.auth != "signature"
        if replayable:
            async with pool.connection() as conn:
                stored = await push_store.reserve_key(conn, connector_id, key, route.name,
                                                      settings.connectors.idempotency_ttl_seconds)
            if stored is not None:
                attempt.counter = "replayed"
                return Response(stored.body, status_code=stored.status, media_type=stored.content_type)
        try:
            _take_token(attempt, row)
            if route.auth == "signature":
                await _reserve_signature(pool, connector_id, request, route, key)
            # Nothing is written after the items of a push without a key to keep its answer under,
            # once push health is `active`: its audit can commit with them.
            within = None if replayable or not _push_active(row) else attempt
            _, receipts = await _bounded(_deliver(pool, settings, served, row, route, request, raw, within))
        except BaseException as exc:
            if replayable:
                await _complete_key(pool, connector_id, key, _kept(exc))
            raise
        answer = msgspec.json.encode(PushAccepted(receipts=receipts))
        if replayable:
            await _complete_key(pool, connector_id, key, push_store.StoredAnswer(202, "application/json", answer))
        return Response(answer, status_code=202, media_type="application/json")

    return await _audited(svc.push_audit, attempt, work)


PUSH_PATH = "/v0/connectors/{connector_id}/api/{path}"


def _push_operation(operation_id: str, method: str):
    """pushConnectorAPI under one method (decisions-part2 "Push route": methods are a subset of
    POST, PUT, PATCH and DELETE, GET only for a challenge). Every method is routed here, declared
    or not, so the guards answer in the contract's order: an unknown instance is 404 before an
    undeclared method is 405, and each attempt is audited."""
    if method == "GET":
        declared = {"responses": {200: RELAY_BODY}}
    else:
        declared = {"body": PUSH_BODY, "headers": (("idempotency-key", False),), "responses": {202: PushAccepted}}

    async def push(call: Call[None, None], connector_id: str, path: str) -> Response:
        return await _push(call, connector_id, path)

    push.__name__ = push.__qualname__ = f"push_connector_api_{method.lower()}"
    return operation(operation_id, method, PUSH_PATH, permission=None, **declared)(push)


PUSH_OPERATIONS = [_push_operation("pushConnectorAPI", "POST"), _push_operation("pushConnectorAPIPut", "PUT"),
                   _push_operation("pushConnectorAPIPatch", "PATCH"),
                   _push_operation("pushConnectorAPIDelete", "DELETE"),
                   _push_operation("challengeConnectorAPI", "GET")]


async def _complete_key(pool, connector_id: str, key: str, answer: push_store.StoredAnswer | None) -> None:
    async with pool.connection() as conn:
        await push_store.complete_key(conn, connector_id, key, answer)


async def _reserve_signature(pool, connector_id: str, request: Request, route: PushRoute, key: str | None) -> None:
    """rule 12: the engine's signature and timestamp check, then the signature's (and the key's)
    fingerprint reserved for the route's window, before the plugin is called."""
    signature = check_signature({k.lower(): v for k, v in request.headers.items()}, route, time.time())
    prints = [push_store.fingerprint("signature", signature)]
    if key is not None:
        prints.append(push_store.fingerprint("key", key))
    async with pool.connection() as conn:
        await push_store.reserve_fingerprints(conn, connector_id, prints, route.window_seconds)


def _kept(exc: BaseException) -> push_store.StoredAnswer | None:
    """A refusal worth replaying for the key (the plugin's verdict, a rejected item); None frees it."""
    if isinstance(exc, PluginVerdict):
        return push_store.StoredAnswer(exc.status, exc.content_type, exc.body)
    if isinstance(exc, ApiError) and exc.status == 422:
        return push_store.StoredAnswer(422, "application/json", msgspec.json.encode(exc.body()))
    return None


def _take_token(attempt: Attempt, row: dict[str, Any]) -> None:
    policy = row["push_policy"] or {}
    try:
        RATE_LIMITS.take(row["connector_id"], policy.get("rate_per_second", 10.0), policy.get("burst", 20))
    except ApiError:
        attempt.counter = "rate_limited"
        raise


async def _bounded(coroutine):
    try:
        async with asyncio.timeout(STAGE_SECONDS):
            return await coroutine
    except TimeoutError:
        raise ApiError(503, "push_timeout", "The plugin and ingestion took longer than 9 s; retry later.",
                       retryable=True, headers={"Retry-After": "5"}) from None


async def _deliver(pool, settings, served: ServedKind, row: dict[str, Any], route: PushRoute | None,
                   request: Request, raw: bytes, attempt: Attempt | None = None) -> tuple[Relayed, list[dict]]:
    """The plugin's answer to the request (`route` None: the relay) and the Receipts of its items
    (`attempt`: recorded as received with them when they are all accepted)."""
    try:
        answer, items = await _receive(settings, served, row, RELAY if route is None else route.name, request, raw,
                                       route, STAGE_SECONDS)
    except sealed.Unreadable:
        raise _plugin_unavailable() from None
    receipts = await _ingest(pool, services(request).push_ingests, served, row, items, attempt)
    await _mark_push_active(pool, row)
    return answer, receipts


# A header an HTTP/1.1 server can write (RFC 9110): a token for its name, a value without CR, LF or NUL.
_FIELD_VALUE_BREAKS = re.compile(r"[\r\n\x00]")


def relayed_response(response: Any) -> Relayed | None:
    """A plugin's `response` (a challenge's answer, the relay's reply) as the API sends it on: a 2xx
    status kept (else 200), its headers as a relayed request's are (relayed_headers: no framing,
    hop-by-hop or credential headers, which the server sets or must not echo) less values that are
    not strings, the body decoded; None when it cannot be sent (not an object, a header no server
    may write, a body that is not base64)."""
    response = {"status": 200} if response is None else response
    if not isinstance(response, dict) or not isinstance(response.get("headers") or {}, dict) \
            or not isinstance(response.get("body_base64") or "", str):
        return None
    headers = relayed_headers([(str(k), v) for k, v in (response.get("headers") or {}).items() if isinstance(v, str)])
    if not all(HEADER_NAME.fullmatch(k) and not _FIELD_VALUE_BREAKS.search(v) for k, v in headers.items()):
        return None
    try:
        body = base64.b64decode(response.get("body_base64") or "", validate=True)
    except binascii.Error:
        return None
    status = response.get("status", 200) if isinstance(response.get("status"), int) else 200
    return (status if 200 <= status < 300 else 200), headers, body


def _plugin_answer(delivered: tuple[Relayed, list[dict]]) -> Response:
    """The plugin's own `response`, as _receive checked it."""
    status, headers, body = delivered[0]
    return Response(body, status_code=status, headers={k: v for k, v in headers.items() if k != "content-type"},
                    media_type=headers.get("content-type", "text/plain"))


async def _relay(call: Call, connector_id: str) -> Response:
    request = call.request
    svc = services(request)
    settings = svc.settings
    client_ip = _client_ip(request, settings)
    pool = svc.pool
    row, served = await _instance(svc, connector_id)
    if not served.description.push.relay:
        raise not_found("connector")
    attempt = Attempt(row, RELAY, request.method, client_ip)

    async def work() -> Response:
        if not row["enabled"]:
            raise not_found("connector")
        raw = await read_body(request, MAX_BODY_BYTES)
        check_sizes(len(raw), request.url.query or "")
        check_allowed(client_ip, (row["push_policy"] or {}).get("allowed_cidrs"))
        _take_token(attempt, row)
        # rule 13: a kind whose declared receive route is signed guards its relay address alike;
        # GET challenges bypass the POST signature guards (rule 12).
        signed = next((r for r in served.description.push.routes if r.auth == "signature"), None)
        if signed is not None and request.method == "POST" and served.provider is not None:
            await _reserve_signature(pool, connector_id, request, signed, None)
        return _plugin_answer(await _bounded(_deliver(pool, settings, served, row, None, request, raw)))

    return await _audited(svc.push_audit, attempt, work)


@operation("relayConnectorChallenge", "GET", "/v0/connector-webhooks/{connector_id}", permission=None,
           responses={200: RELAY_BODY})
async def relay_connector_challenge(call: Call[None, None], connector_id: str) -> Response:
    """A source's verification challenge, relayed to the plugin like a delivery."""
    return await _relay(call, connector_id)


@operation("relayConnectorDelivery", "POST", "/v0/connector-webhooks/{connector_id}", permission=None,
           body=RELAY_BODY, responses={200: RELAY_BODY})
async def relay_connector_delivery(call: Call[None, None], connector_id: str) -> Response:
    """A source's delivery: the plugin verifies it with the credential and returns the items."""
    return await _relay(call, connector_id)


ROUTES = [*PUSH_OPERATIONS, relay_connector_challenge, relay_connector_delivery]
