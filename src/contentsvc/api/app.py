"""The Litestar application: routes, the Error envelope, logging, lifespan."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.types import ASGIApp
from psycopg_pool import PoolTimeout

from contentsvc.api import changes, corpora, health, openapi, receipts, records, search
from contentsvc.api import operations, uploads
from contentsvc.api.backlog import IngestBacklog
from contentsvc.api.http import Services, storage_failure
from contentsvc.api.routes import with_options
from contentsvc.connectors import push_routes as connector_push_routes
from contentsvc.connectors import routes as connector_routes
from contentsvc.monitoring import delivery_routes
from contentsvc.monitoring import migration as evaluator_migration
from contentsvc.monitoring import previews as subscription_previews
from contentsvc.monitoring import match_routes
from contentsvc.monitoring import routes as monitoring_routes
from contentsvc.plugins import routes as plugin_routes
from contentsvc.auth.cache import PrincipalCache
from contentsvc.auth.keys import KEYS_CHANNEL
from contentsvc.commands.group_commit import SingleCommandGroups
from contentsvc.connectors.push_ingests import PushIngests
from contentsvc.connectors.push_store import PushAudit
from contentsvc.readmodel.changes import FEED_PROJECTOR, FeedTicker, StreamPages
from contentsvc.storage.notified_cache import NotifiedCache
from contentsvc.config import MAX_BATCH_BYTES, Settings
from contentsvc.storage.availability import (
    DatabaseWatch,
    StorageUnavailable,
    connection_options,
    unreachable,
    wait_until_answering,
)
from contentsvc.storage.database import BoundedPool, async_pool
from contentsvc.storage.heap import freeze_start_up_heap, reuse_freed_buffers
from contentsvc.domain.cursors import CursorCodec
from contentsvc.domain.errors import ApiError
from contentsvc.ids import new_id
from contentsvc.journal.store import PROGRESS_CHANNEL
from contentsvc.logging import get_logger
from contentsvc.search.corpus_routes import ROUTES_CHANNEL, CorpusRoutes
from contentsvc.search.service import LexicalSearcher, VectorSearcher

log = get_logger("contentsvc.api")

_STATUS_CODES = {
    400: "malformed_json",
    401: "invalid_api_key",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    429: "rate_limited",
}


def _error_response(error: ApiError) -> Response:
    return Response(content=error.body(), status_code=error.status, media_type="application/json",
                    headers=error.headers or None)


def _api_error(_: Request, exc: ApiError) -> Response:
    return _error_response(exc)


def _http_error(_: Request, exc: HTTPException) -> Response:
    status = exc.status_code
    code = _STATUS_CODES.get(status, "internal_error" if status >= 500 else "invalid_input")
    messages = {404: "No such route.", 405: "Method not allowed on this route.",
                413: "The request body is too large.", 400: "The request is malformed."}
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() == "allow"}
    return _error_response(ApiError(status, code, messages.get(status, "The request was refused."),
                                    retryable=status >= 500, headers=headers))


def _storage_error(request: Request, exc: Exception) -> Response:
    error = storage_failure(exc, request.app.state.settings)
    log.warning(error.code, error=type(exc).__name__)
    return _error_response(error)


def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled_error", error=type(exc).__name__, route=request.scope.get("path"), exc_info=exc)
    return _error_response(ApiError(500, "internal_error", "An internal error occurred.", retryable=True))


def logging_middleware(app):
    """One JSON log line per request: id, org, route, status, duration. Never a key or a body."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        request_id = new_id("req")
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                message.setdefault("headers", []).append((b"x-request-id", request_id.encode()))
            await send(message)

        try:
            await app(scope, receive, send_wrapper)
        finally:
            handler = scope.get("route_handler")
            log.info(
                "request",
                request_id=request_id,
                org=(scope.get("state") or {}).get("org_id"),
                method=scope["method"],
                route=getattr(handler, "paths", None) and sorted(handler.paths)[0] or scope["path"],
                status=status["code"],
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )

    return middleware


async def _listen(url: str, settings: Settings, services: Services) -> None:
    """Wakes change streams when the read model commits, reloads searchers when the lexical
    projector commits, and drops from the caches what changed (a key, a pushed-to Connector, the
    plan, a search's routes); reconnects after outages (the watch logs them)."""
    options = connection_options(settings.database, "contentsvc api listen", bounded_statements=False)
    keys, instances, search_routes = services.keys, services.push_instances, services.search_routes
    caches = (keys, instances, search_routes)
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True, **options) as conn:
                for channel in (PROGRESS_CHANNEL, KEYS_CHANNEL, connector_push_routes.CONNECTORS_CHANNEL,
                                connector_push_routes.PLANS_CHANNEL, ROUTES_CHANNEL):
                    await conn.execute(f"LISTEN {channel}")
                for cache in caches:
                    cache.listening_started()
                async for notice in conn.notifies():
                    if notice.channel == KEYS_CHANNEL:
                        keys.clear()
                    elif notice.channel == ROUTES_CHANNEL:
                        search_routes.clear()
                    elif notice.channel == connector_push_routes.CONNECTORS_CHANNEL:
                        instances.forget(notice.payload)
                    elif notice.channel == connector_push_routes.PLANS_CHANNEL:
                        instances.clear()
                    elif notice.payload == FEED_PROJECTOR:
                        services.feed_moved.bump()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database is away: streams fall back to polling, keys are read
            log.debug("journal_listen_lost", error=type(exc).__name__)
        finally:
            for cache in caches:
                cache.listening_lost()
        await asyncio.sleep(1.0)


# Every route the app serves; the OpenAPI document is generated from their declarations.
ROUTES = with_options([
    *records.ROUTES, *receipts.ROUTES, *search.ROUTES, *corpora.ROUTES, *changes.ROUTES, *health.ROUTES,
    *openapi.ROUTES, *uploads.ROUTES, *operations.ROUTES, *plugin_routes.ROUTES,
    *monitoring_routes.ROUTES, *delivery_routes.ROUTES, *connector_routes.ROUTES, *connector_push_routes.ROUTES, *subscription_previews.ROUTES, *evaluator_migration.ROUTES,
    *match_routes.ROUTES,
])


async def _cursor_secret(url: str, settings: Settings) -> bytes:
    options = connection_options(settings.database, "contentsvc api", bounded_statements=True)
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True, **options) as conn:
                cur = await conn.execute("SELECT secret FROM service_secrets WHERE name = 'cursor_hmac'")
                return bytes((await cur.fetchone())[0])
        except psycopg.OperationalError as exc:
            if not unreachable(exc):
                raise
            await wait_until_answering(url, settings.database, "api")


def create_app(settings: Settings, database_url: str, public_base_url: str | None = None) -> ASGIApp:
    """public_base_url: where clients reach this API (default: from the settings; `serve` passes
    the one for the address it was told to listen on)."""
    public_base_url = public_base_url or settings.public_base_url()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Started during an outage: wait it out (one database_unavailable line), not a crash loop.
        await wait_until_answering(database_url, settings.database, "api")
        secret = await _cursor_secret(database_url, settings)
        pool: BoundedPool
        watch = DatabaseWatch(database_url, settings.database, "api", on_back=lambda: pool.check())
        pool = async_pool(database_url, settings.database, watch)
        await pool.open(wait=False)
        instances: connector_push_routes.PushInstances = NotifiedCache(max_entries=10_000)
        app.state.services = Services(
            settings=settings, pool=pool, cursors=CursorCodec(secret), feed_moved=FeedTicker(),
            stream_pages=StreamPages(pool), lexical=LexicalSearcher(settings.home),
            vectors=VectorSearcher(settings.home), public_base_url=public_base_url, keys=PrincipalCache(),
            single_commands=SingleCommandGroups(pool), push_ingests=PushIngests(pool), push_audit=PushAudit(pool),
            push_instances=instances, search_routes=CorpusRoutes(),
            backlog=IngestBacklog(pool, settings.ingest.max_backlog_seconds))
        tasks = [asyncio.create_task(_listen(database_url, settings, app.state.services)),
                 asyncio.create_task(watch.run())]
        freeze_start_up_heap()
        reuse_freed_buffers()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await pool.close()

    app = Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        state=State({"settings": settings}),
        exception_handlers={
            ApiError: _api_error,
            HTTPException: _http_error,
            psycopg.OperationalError: _storage_error,
            PoolTimeout: _storage_error,
            StorageUnavailable: _storage_error,
            Exception: _unexpected,
        },
        openapi_config=None,
        logging_config=None,  # the process's logging (contentsvc.logging) renders litestar's records too
        request_max_body_size=MAX_BATCH_BYTES + 1,
        debug=False,
    )
    # Around the whole application, not in its middleware list: litestar runs that list only for a
    # matched route, so a path no route matches (404) or a method none takes (405) was never logged.
    return logging_middleware(app)
