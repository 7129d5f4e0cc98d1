"""Each route declares its contract operation once; the declaration both
decodes the request and documents it (api/openapi.py walks the app's routes).

A route is written as

    @operation("getCorpus", "GET", "/v0/corpora/{corpus_id}", permission=("corpora:read",),
               responses={200: Corpus})
    async def get_corpus(call: Call, corpus_id: str) -> Response: ...

and receives, in order of the checks: the caller's Principal (401, then 403),
the declared query parameters (422 invalid_input with `field` like `/limit`),
then the declared body (413 past the route's limit, 400 malformed_json, 422
invalid_schema with a JSON Pointer). Litestar's own decoding is not used: its
errors are not the contract's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any, Awaitable, Callable, Generic, TypeVar

import msgspec
from litestar import Request, route
from msgspec import inspect

from contentsvc.api.http import authenticate, read_body
from contentsvc.auth.principal import Principal
from contentsvc.config import MAX_INGEST_BYTES, Settings
from contentsvc.domain.decoding import decode_body, pointer_of
from contentsvc.domain.errors import ApiError, invalid_input

B = TypeVar("B")
Q = TypeVar("Q")


class Query(msgspec.Struct, kw_only=True):
    """Query parameters of a route: scalar members, unknown parameters ignored (decisions.md Errors)."""


@dataclass(frozen=True)
class Stream:
    """A body that is not JSON: the SSE answer of streamChanges, the bytes of the presigned PUT."""

    media_type: str
    description: str


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: str
    path: str  # as the document writes it: /v0/records/{record_id}
    permission: tuple[str, ...] | None  # None: no API key (health, the presigned PUT)
    responses: dict[int, type | Stream]  # the first is the usual success
    body: type | Stream | None = None
    body_required: bool = True
    body_limit: int = MAX_INGEST_BYTES
    # Bounds the code enforces beyond the body Struct's own, per top-level member, as JSON
    # Schema keywords; a Struct type as a value stands for a reference to its schema.
    body_members: dict[str, dict] | Callable[[Settings], dict[str, dict]] = field(default_factory=dict)
    query: type[Query] | None = None
    query_refusal: Callable[[], ApiError] | None = None  # answers a bad query instead of invalid_input
    headers: tuple[tuple[str, bool], ...] = ()  # (name, required): headers the route reads itself

    @property
    def route_path(self) -> str:
        """Litestar's spelling of the path: every parameter a string, except a trailing `{path}`,
        which takes the rest of the path, slashes included (a Connector's declared push routes)."""
        return "/".join(f"{{{p[1:-1]}:{'path' if p == '{path}' else 'str'}}}" if p.startswith("{") else p
                        for p in self.path.split("/"))

    def members(self, settings: Settings) -> dict[str, dict]:
        return self.body_members(settings) if callable(self.body_members) else self.body_members


@dataclass
class Call(Generic[B, Q]):
    """What a route receives once its declaration has checked the request."""

    request: Request
    principal: Principal  # None only where the declaration names no permission
    body: B
    query: Q


def operation_of(handler: Any) -> Operation | None:
    """The declaration behind a registered route handler (None for Litestar's own, e.g. OPTIONS)."""
    return handler.opt.get("operation")


def operation(operation_id: str, method: str, path: str, **declared: Any):
    """Registers `fn` as the route of one contract operation; see the module docstring."""
    spec = Operation(operation_id, method, path, **declared)

    def register(fn: Callable[..., Awaitable[Any]]):
        async def endpoint(request: Request) -> Any:
            principal = await authenticate(request, *spec.permission) if spec.permission is not None else None
            if any("\x00" in value for value in request.path_params.values()):
                raise ApiError(404, "not_found", "No such resource.")  # no id holds U+0000
            query = parse_query(request, spec.query, spec.query_refusal) if spec.query else None
            body = await _read_declared_body(request, spec)
            return await fn(Call(request, principal, body, query), **request.path_params)

        endpoint.__name__ = endpoint.__qualname__ = fn.__name__
        endpoint.__doc__ = fn.__doc__
        status, answer = next(iter(spec.responses.items()))
        return route(
            spec.route_path,
            http_method=spec.method,
            operation_id=spec.operation_id,
            status_code=status,
            # Litestar's Content-Type wins over a streamed response's own.
            media_type=answer.media_type if isinstance(answer, Stream) else "application/json",
            opt={"operation": spec},
            # Unbounded here only where the route streams and bounds the body itself.
            **({"request_max_body_size": None} if isinstance(spec.body, Stream) else {}),
        )(endpoint)

    return register


async def _read_declared_body(request: Request, spec: Operation) -> Any:
    if spec.body is None or isinstance(spec.body, Stream):
        return None  # no body, or one the route reads as a stream
    raw = await read_body(request, spec.body_limit)
    if not spec.body_required and not raw:
        # An optional body may be absent (empty); anything else must be the JSON the document
        # declares. White space alone is no JSON text (RFC 8259), so it is malformed_json too.
        return None
    return decode_body(raw, spec.body)


def parse_query(request: Request, type_: type[Q], refusal: Callable[[], ApiError] | None = None) -> Q:
    """The query Struct from the request's parameters, with the bounds its annotations declare.

    An empty string parameter is absent; an integer must parse and lie within
    its bounds; a string must be one the annotation allows (an enum's value, a
    length); a missing required one is refused. Faults are 422 invalid_input
    naming the parameter as a pointer, unless the route gives its own refusal.
    """
    values: dict[str, Any] = {}
    for member, kind in _query_members(type_):
        name = member.encode_name
        raw = request.query_params.get(name)
        try:
            if raw is None or (raw == "" and not isinstance(kind, inspect.IntType)):
                if member.required:
                    raise invalid_input(f"The query parameter {name} is required.", f"/{name}")
                continue
            if "\x00" in raw:  # PostgreSQL stores no U+0000: refused here, never a storage error
                raise invalid_input(f"The query parameter {name} may not contain U+0000.", f"/{name}")
            values[member.name] = _parse_int(name, kind, raw) if isinstance(kind, inspect.IntType) else raw
        except ApiError:
            if refusal is not None:
                raise refusal() from None
            raise
    try:
        return msgspec.convert(values, type_)  # a Struct's constructor would not check its annotations
    except msgspec.ValidationError as exc:
        if refusal is not None:
            raise refusal() from None
        message, pointer = pointer_of(exc)
        name = pointer[1:]
        kind = next((kind for member, kind in _query_members(type_) if member.encode_name == name), None)
        if isinstance(kind, inspect.LiteralType):  # name the values it takes, as the document does
            message = "must be one of " + ", ".join(map(str, sorted(kind.values)))
        raise invalid_input(f"The query parameter {name}: {message}.", pointer) from None


@cache
def _query_members(type_: type[Query]) -> tuple[tuple[inspect.Field, inspect.Type], ...]:
    """Each member of a query Struct with its scalar type, worked out once per Struct
    (type_info rebuilds the description on every call)."""
    return tuple((member, _scalar(member.type)) for member in inspect.type_info(type_).fields)


def _scalar(kind: inspect.Type) -> inspect.Type:
    """`int | None` -> int: an absent parameter is the default, never null."""
    if isinstance(kind, inspect.UnionType):
        [kind] = [t for t in kind.types if not isinstance(t, inspect.NoneType)]
    return kind


def _parse_int(name: str, kind: inspect.IntType, raw: str) -> int:
    low, high = kind.ge, kind.le
    span = _span(low, high)
    try:
        value = int(raw)
    except ValueError:
        raise invalid_input(f"{name} must be an integer{' ' + span if span else ''}.", f"/{name}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise invalid_input(f"{name} must be {span}.", f"/{name}")
    return value


def _span(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"from {low} to {high}"
    if low is not None:
        return f"at least {low}"
    return f"at most {high}" if high is not None else ""


def with_options(handlers: list[Any]) -> list[Any]:
    """The handlers, each path preceded by its own OPTIONS answer naming every method it serves.

    Litestar adds an OPTIONS handler to the first route registered on a path and
    keeps it when a later handler joins that path, so its Allow would miss the
    later methods (GET /v0/records next to POST). Registered first, this one is kept.
    """
    methods: dict[str, set[str]] = {}
    for handler in handlers:
        for path in handler.paths:
            methods.setdefault(path, {"OPTIONS"}).update(handler.http_methods)
    return [*(_options_answer(path, allowed) for path, allowed in methods.items()), *handlers]


def _options_answer(path: str, allowed: set[str]) -> Any:
    async def options() -> None:
        return None

    return route(path, http_method="OPTIONS", include_in_schema=False, status_code=204,
                 response_headers={"Allow": ", ".join(sorted(allowed))})(options)
