"""Helpers every route uses: the caller's key, bodies, query values, answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
from litestar import Request, Response
from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import INVALID_KEY, Principal, bearer_secret, load_principal
from contentsvc.readmodel.changes import FeedTicker
from contentsvc.config import Settings
from contentsvc.domain.cursors import CursorCodec, InvalidCursor
from contentsvc.domain.decoding import decode_body
from contentsvc.domain.errors import ApiError, invalid_input

if TYPE_CHECKING:
    from contentsvc.search.service import LexicalSearcher, VectorSearcher

T = TypeVar("T")


@dataclass
class Services:
    """What the routes share, on app.state.services."""

    settings: Settings
    pool: AsyncConnectionPool
    cursors: CursorCodec
    feed_moved: FeedTicker  # bumped when the read model commits (LISTEN)
    lexical: LexicalSearcher  # the serving lexical generation, reloaded when the lexical projector commits
    vectors: VectorSearcher  # the serving vector generation's snapshot and the query embedder


def services(request: Request) -> Services:
    return request.app.state.services


async def authenticate(request: Request, *actions: str) -> Principal:
    """The key's Principal, refusing 401 without a valid key and 403 without an action."""
    secret = bearer_secret(request.headers.get("authorization"))
    if secret is None:
        raise INVALID_KEY
    async with services(request).pool.connection() as conn:
        principal = await load_principal(conn, secret)
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


async def read_json(request: Request, type_: type[T], limit: int) -> T:
    return decode_body(await read_body(request, limit), type_)


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_input(f"{name} must be an integer from {low} to {high}.", f"/{name}") from None
    if not low <= value <= high:
        raise invalid_input(f"{name} must be from {low} to {high}.", f"/{name}")
    return value


def query_str(request: Request, name: str, *, required: bool = False) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if required:
            raise invalid_input(f"The query parameter {name} is required.", f"/{name}")
        return None
    return raw


def page_after(request: Request, kind: str, binding: dict[str, str], resync_url: str) -> str | None:
    """The keyset position of `page_cursor`, checked against what the cursor is bound to.

    Not a cursor of this kind: 422 invalid_cursor. Bound to another filter or
    scope: 409 cursor_scope_changed with resync_url (part 1 rules 6 and 14).
    """
    token = query_str(request, "page_cursor")
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
