"""Helpers every route uses: the caller's key, bodies, page cursors, answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from litestar import Request, Response
from psycopg_pool import AsyncConnectionPool

from contentsvc.api.backlog import IngestBacklog
from contentsvc.auth.cache import PrincipalCache
from contentsvc.auth.principal import INVALID_KEY, Principal, bearer_secret, load_principal_by_hash
from contentsvc.commands.group_commit import SingleCommandGroups
from contentsvc.connectors.push_ingests import PushIngests
from contentsvc.connectors.push_store import PushAudit
from contentsvc.readmodel.changes import FeedTicker, StreamPages
from contentsvc.storage.notified_cache import NotifiedCache
from contentsvc.config import Settings
from contentsvc.domain.cursors import CursorCodec, InvalidCursor
from contentsvc.domain.errors import ApiError, server_busy, storage_unavailable
from contentsvc.storage.database import PoolBusy

if TYPE_CHECKING:
    from contentsvc.search.corpus_routes import CorpusRoutes
    from contentsvc.search.service import LexicalSearcher, VectorSearcher


# Keyword-only: several members share a type, so a positional slip would go unnoticed.
@dataclass(kw_only=True)
class Services:
    """What the routes share, on app.state.services."""

    settings: Settings
    pool: AsyncConnectionPool
    cursors: CursorCodec
    feed_moved: FeedTicker  # bumped when the read model commits (LISTEN)
    stream_pages: StreamPages  # the change streams' page reads, shared by streams at one position
    lexical: LexicalSearcher  # the serving lexical generation, reloaded when the lexical projector commits
    vectors: VectorSearcher  # the serving vector generation's snapshot and the query embedder
    public_base_url: str  # where clients reach this API: the base of the URLs it hands out
    keys: PrincipalCache  # cleared by the listening connection whenever a key changes
    single_commands: SingleCommandGroups  # concurrent single ingests of a key share a commit
    push_ingests: PushIngests  # concurrent pushes' items to a Connector share a commit, with their audit
    push_audit: PushAudit  # concurrent push attempts on a Connector share their audit's commit
    push_instances: NotifiedCache  # pushed-to Connectors and their kinds, dropped when announced changed
    search_routes: CorpusRoutes  # what a search reads before it ranks, dropped when announced changed
    backlog: IngestBacklog  # ingests answer 429 while the folds are too far behind


def services(request: Request) -> Services:
    return request.app.state.services


def storage_failure(exc: BaseException, settings: Settings) -> ApiError:
    """The answer to a request (or a change stream) whose storage failed: 429 `server_busy` when
    every pooled connection stayed lent to other requests, else 503 `storage_unavailable`."""
    if isinstance(exc, PoolBusy):
        return server_busy()
    return storage_unavailable(settings.database.retry_after_seconds)


async def cached_principal(request: Request, secret: str) -> Principal | None:
    """The Principal of an API key's secret (None: no live key), from the key cache or the database."""
    pool = services(request).pool

    async def read(digest: bytes) -> Principal | None:
        async with pool.connection() as conn:
            return await load_principal_by_hash(conn, digest)

    return await services(request).keys.principal(secret, read)


async def authenticate(request: Request, *actions: str) -> Principal:
    """The key's Principal, refusing 401 without a valid key and 403 without an action."""
    secret = bearer_secret(request.headers.get("authorization"))
    if secret is None:
        raise INVALID_KEY
    principal = await cached_principal(request, secret)
    if principal is None:
        raise INVALID_KEY
    request.scope.setdefault("state", {})["org_id"] = principal.org_id
    principal.require(*actions)
    return principal


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused with 413 request_too_large past `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(limit: int) -> ApiError:
    return ApiError(413, "request_too_large", f"The request body exceeds {limit} bytes.")


def page_after(request: Request, token: str | None, kind: str, binding: dict[str, str],
               resync_url: str) -> str | None:
    """The keyset position of the `page_cursor` token, checked against what the cursor is bound to.

    Not a cursor of this kind: 422 invalid_cursor. Bound to another filter or
    scope: 409 cursor_scope_changed with resync_url (part 1 rules 6 and 14).
    """
    if token is None:
        return None
    try:
        fields = services(request).cursors.decode(token, kind)
    except InvalidCursor:
        raise ApiError(422, "invalid_cursor", f"page_cursor is not a {kind} page cursor.",
                       field="/page_cursor") from None
    if any(fields.get(k) != v for k, v in binding.items()):
        raise ApiError(409, "cursor_scope_changed", "page_cursor was issued for another filter or scope.",
                       resync_url=resync_url)
    return fields["after"]


def respond(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=msgspec.json.encode(body),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
