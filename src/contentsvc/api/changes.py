"""pollChanges and streamChanges (part 1 rules 18 and 19, decisions.md Change feed)."""

from __future__ import annotations

import time
from typing import Annotated, AsyncIterator

import msgspec
import psycopg
from litestar import Request, Response
from litestar.response import ServerSentEvent, ServerSentEventMessage
from msgspec import Meta
from psycopg_pool import PoolTimeout

from contentsvc.api.http import Services, bearer_secret, cached_principal, respond, services, storage_failure
from contentsvc.api.routes import Call, Query, Stream, operation
from contentsvc.auth.principal import Principal
from contentsvc.readmodel.changes import ChangeCursors, hidden_families, read_page, start_position
from contentsvc.config import CHANGE_PAGE_DEFAULT, CHANGE_PAGE_MAX
from contentsvc.domain.models import ChangePage, NonEmpty
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.logging import get_logger
from contentsvc.storage.availability import StorageUnavailable
from contentsvc.readmodel.corpora import existing_corpora

log = get_logger("contentsvc.api.changes")


def _cursors(svc: Services) -> ChangeCursors:
    return ChangeCursors(svc.cursors, svc.settings.change_retention_seconds)


class StreamQuery(Query, kw_only=True):
    corpus_id: NonEmpty
    cursor: NonEmpty | None = None


class PollQuery(StreamQuery, kw_only=True):
    limit: Annotated[int, Meta(ge=1, le=CHANGE_PAGE_MAX)] = CHANGE_PAGE_DEFAULT


async def _feed_corpus(call: Call[None, StreamQuery]) -> str:
    """The feed's Corpus: in the key's scope, and existing."""
    p, corpus_id = call.principal, call.query.corpus_id
    p.require_corpus(corpus_id)
    async with services(call.request).pool.connection() as conn:
        if not await existing_corpora(conn, p.org_id, [corpus_id]):
            raise not_found("corpus")
    return corpus_id


@operation("pollChanges", "GET", "/v0/changes", permission=("changes:read",), query=PollQuery,
           responses={200: ChangePage})
async def poll_changes(call: Call[None, PollQuery]) -> Response:
    p, corpus_id, limit = call.principal, await _feed_corpus(call), call.query.limit
    svc = services(call.request)
    cursors = _cursors(svc)
    token = call.query.cursor
    if token is None:  # start now
        head = await start_position(svc.pool, svc.feed_moved)
        return respond(ChangePage(items=[], next_cursor=cursors.encode(p, corpus_id, head)))
    after = cursors.decode(p, corpus_id, token)
    async with svc.pool.connection() as conn:
        events, next_position = await read_page(conn, p.org_id, corpus_id, after, limit, hidden_families(p))
    return respond(ChangePage(items=[e for _, e in events], next_cursor=cursors.encode(p, corpus_id, next_position)))


async def _still_authorized(request: Request) -> bool:
    """Whether the stream's key is still live, from the key cache as every request asks it (a
    revocation clears it: decisions.md "Keys"). Reading the key at every wake of every stream
    took a pooled connection per stream and wake, beside the one its page takes: two dozen
    streams woken by each ingest batch kept the pool full, and an ingest waited out its 3 s."""
    secret = bearer_secret(request.headers.get("authorization"))
    return secret is not None and await cached_principal(request, secret) is not None


def _stream_error(error: ApiError) -> ServerSentEventMessage:
    return ServerSentEventMessage(event="stream_error", data=msgspec.json.encode(error.body()).decode())


async def _stream(
    request: Request, svc: Services, p: Principal, corpus_id: str, position: int, start_now: bool
) -> AsyncIterator[ServerSentEventMessage]:
    """The events; when the database goes away the stream ends with a stream_error
    (part 1 rule 19) so the client knows to reconnect from its last event id."""
    try:
        async for message in _events(request, svc, p, corpus_id, position, start_now):
            yield message
    except (StorageUnavailable, psycopg.OperationalError, PoolTimeout) as exc:
        error = storage_failure(exc, svc.settings)
        log.warning(f"stream_{error.code}", error=type(exc).__name__)
        yield _stream_error(error)


async def _events(
    request: Request, svc: Services, p: Principal, corpus_id: str, position: int, start_now: bool
) -> AsyncIterator[ServerSentEventMessage]:
    cursors = _cursors(svc)
    idle_every = svc.settings.idle_checkpoint_seconds
    if start_now:
        cursor = cursors.encode(p, corpus_id, position)
        yield ServerSentEventMessage(event="checkpoint", id=cursor, data=msgspec.json.encode({"cursor": cursor}).decode())
    # A resumed stream says where it stands at once when it has nothing to send.
    last_sent = time.monotonic() if start_now else float("-inf")
    hidden = hidden_families(p)
    while True:
        if not await _still_authorized(request):
            yield _stream_error(ApiError(401, "invalid_api_key", "The API key was revoked."))
            return
        seen = svc.feed_moved.count
        events, next_position = await svc.stream_pages.read(p.org_id, corpus_id, position, hidden, seen)
        for event_position, event in events:
            yield ServerSentEventMessage(
                event="change",
                id=cursors.encode(p, corpus_id, event_position),
                data=msgspec.json.encode(event).decode(),
            )
        moved = next_position != position
        position = next_position
        if events:
            last_sent = time.monotonic()
        elif moved or time.monotonic() - last_sent >= idle_every:
            # Scanned past invisible events, or idle: say where we are.
            cursor = cursors.encode(p, corpus_id, position)
            yield ServerSentEventMessage(event="checkpoint", id=cursor, data=msgspec.json.encode({"cursor": cursor}).decode())
            last_sent = time.monotonic()
        if len(events) == svc.stream_pages.page_size:
            continue
        remaining = max(0.05, idle_every - (time.monotonic() - last_sent))
        await svc.feed_moved.wait_past(seen, timeout=min(remaining, 5.0))


EVENTS = Stream("text/event-stream", "change, checkpoint and stream_error events (rule 19)")


@operation("streamChanges", "GET", "/v0/changes/stream", permission=("changes:read",), query=StreamQuery,
           headers=(("Last-Event-ID", False),), responses={200: EVENTS})
async def stream_changes(call: Call[None, StreamQuery]) -> ServerSentEvent:
    request, p, corpus_id = call.request, call.principal, await _feed_corpus(call)
    svc = services(request)
    cursors = _cursors(svc)
    # Last-Event-ID takes precedence over the query cursor (rule 19); errors before headers.
    last_event_id = request.headers.get("last-event-id")
    token = last_event_id or call.query.cursor
    if token is None:
        position = await start_position(svc.pool, svc.feed_moved)
        start_now = True
    else:
        position = cursors.decode(p, corpus_id, token, field="/last-event-id" if last_event_id else "/cursor")
        start_now = False
    return ServerSentEvent(
        _stream(request, svc, p, corpus_id, position, start_now),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


ROUTES = [poll_changes, stream_changes]
