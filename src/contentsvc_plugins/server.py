"""The plugin protocol server every first-party plugin runs on (part 2 "Plugin protocol").

A plugin is its folder (holding `contentsvc-plugin.json` and `fixtures/`) plus the
handlers of its contribution routes. This module serves, under `/v0`:

- `GET /v0/discovery`: plugin_api, plugin {id, version}, manifest_digest over the exact
  bytes of the plugin's own manifest file, and the declared contributions;
- `GET /v0/health`: 200 `{status: ok}`, or 503 with the error body when not ready;
- `POST /v0/contributions/...`: the routes the plugin registers.

Every non-2xx answer carries the plugin error body: part 1's Error object
(`code`, `message`, `retryable`, where `retryable` is authoritative), plus
`error_class` and `retry_after_seconds` on connector errors. When a token is set
(`CONTENTSVC_PLUGIN_TOKEN`), every route, health included, answers 401
`invalid_plugin_token` without `Authorization: Bearer <token>` (decisions-part2,
"How the service calls plugins").

A bare ASGI application on uvicorn: the protocol is four shapes of answer, and owning
them means no framework answers a bad request with a shape the engine does not parse.
"""

from __future__ import annotations

import hmac
import inspect
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread
import msgspec

from contentsvc.config.plugins import is_loopback
from contentsvc.logging import get_logger
from contentsvc.plugins.manifest import MANIFEST_FILE, PinnedManifest, parse_manifest

log = get_logger("contentsvc.plugin")

MAX_REQUEST_BYTES = 8 * 1024 * 1024  # requests carry references, never Blob bytes
CONTRIBUTIONS_PREFIX = "/v0/contributions/"


class PluginError(Exception):
    """An answer other than success: the plugin error body with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, *, retryable: bool = False,
                 error_class: str | None = None, retry_after_seconds: int | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.error_class = error_class
        self.retry_after_seconds = retry_after_seconds
        self.headers = headers or {}

    def body(self) -> dict:
        out: dict = {"code": self.code, "message": self.message, "retryable": self.retryable}
        if self.error_class is not None:
            out["error_class"] = self.error_class
        if self.retry_after_seconds is not None:
            out["retry_after_seconds"] = self.retry_after_seconds
        return out


def terminal(code: str, message: str, status: int = 422) -> PluginError:
    """A refusal the same input will always get: the engine must not retry it."""
    return PluginError(status, code, message, retryable=False)


def evaluation_batch(request: dict, max_batch_size: int) -> tuple[dict, list, list[dict]]:
    """A subscription request's record, evaluations and object Parts; refused (terminal) when the
    record or evaluations are missing or there are more evaluations than the manifest allows."""
    record, evaluations = request.get("record"), request.get("evaluations")
    if not isinstance(record, dict) or not isinstance(evaluations, list) or not evaluations:
        raise terminal("invalid_request", "record and evaluations are required", 400)
    if len(evaluations) > max_batch_size:
        raise terminal("invalid_request", f"at most {max_batch_size} evaluations per request", 400)
    return record, evaluations, [part for part in record.get("parts") or [] if isinstance(part, dict)]


# A handler doing its work here runs in a worker thread; one whose work is elsewhere (the pdf
# plugin's reader processes) is a coroutine and is awaited on the event loop: the thread hop cost
# more than the rest of a small PDF's round trip.
Handler = Callable[[dict], dict] | Callable[[dict], Awaitable[dict]]


@dataclass
class Plugin:
    """One plugin: its folder, its contribution handlers keyed by route below /v0/contributions/
    (`normalizer`, `subscription`, `connector/fetch`, ...), and an optional readiness probe."""

    folder: Path
    handlers: dict[str, Handler]
    ready: Callable[[], bool] = lambda: True
    pinned: PinnedManifest = field(init=False)

    def __post_init__(self) -> None:
        # The digest is over the file's exact bytes, read once: what discovery reports is what was read.
        self.pinned = parse_manifest((self.folder / MANIFEST_FILE).read_bytes())

    @property
    def plugin_id(self) -> str:
        return self.pinned.manifest.id

    def discovery(self) -> dict:
        manifest = self.pinned.manifest
        return {"plugin_api": manifest.plugin_api, "plugin": {"id": manifest.id, "version": manifest.version},
                "manifest_digest": self.pinned.digest, "contributions": manifest.contributions.names()}


Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]


class ProtocolApp:
    """The ASGI application serving one Plugin."""

    def __init__(self, plugin: Plugin, token: str | None = None):
        self.plugin = plugin
        self.token = token or None

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.monotonic()
        path, method = scope["path"], scope["method"]
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        invocation_id = headers.get("x-contentsvc-invocation-id")
        contribution = path[len(CONTRIBUTIONS_PREFIX):] if path.startswith(CONTRIBUTIONS_PREFIX) else None
        try:
            status, body = await self._answer(path, method, headers, receive)
            extra_headers: dict[str, str] = {}
            _encode(body)  # an answer that cannot be sent is the handler's defect, answered as one
        except PluginError as error:
            status, body, extra_headers = error.status, error.body(), error.headers
        except Exception as exc:  # a defect answers the error body, never a traceback
            log.error("plugin_handler_failed", plugin=self.plugin.plugin_id, contribution=contribution,
                      invocation_id=invocation_id, error_type=type(exc).__name__,
                      where=_innermost_frame(exc))
            status, extra_headers = 500, {}
            body = PluginError(500, "plugin_internal_error", f"the plugin failed: {type(exc).__name__}").body()
        await _respond(send, status, body, extra_headers)
        if contribution is not None:
            # decisions-part2 "Logging": plugin, contribution, invocation_id, status, duration; never bodies.
            log.info("plugin_invocation", plugin=self.plugin.plugin_id, contribution=contribution,
                     invocation_id=invocation_id, status=status,
                     code=body.get("code") if status >= 400 else None,
                     duration_ms=round((time.monotonic() - started) * 1000, 1))

    async def _answer(self, path: str, method: str, headers: dict[str, str], receive: Receive) -> tuple[int, dict]:
        self._authenticate(headers)
        if path == "/v0/discovery":
            _allow(method, "GET")
            return 200, self.plugin.discovery()
        if path == "/v0/health":
            _allow(method, "GET")
            if not self.plugin.ready():
                raise PluginError(503, "unavailable", "the plugin cannot accept invocations now", retryable=True)
            return 200, {"status": "ok"}
        if path.startswith(CONTRIBUTIONS_PREFIX) and path[len(CONTRIBUTIONS_PREFIX):] in self.plugin.handlers:
            _allow(method, "POST")
            handler = self.plugin.handlers[path[len(CONTRIBUTIONS_PREFIX):]]
            request = _decode(await _read_body(receive))
            if inspect.iscoroutinefunction(handler):  # it waits on another process (pdf), not on the CPU
                return 200, await handler(request)
            # Handlers do blocking work (file reads, parsing): off the event loop, so health keeps answering.
            return 200, await anyio.to_thread.run_sync(handler, request)
        raise PluginError(404, "not_found", f"no route {path}")

    def _authenticate(self, headers: dict[str, str]) -> None:
        if self.token is None:
            return
        scheme, _, presented = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), self.token.encode()):
            raise PluginError(401, "invalid_plugin_token", "missing or wrong plugin token",
                              headers={"www-authenticate": "Bearer"})


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise PluginError(405, "method_not_allowed", f"{method} is not served here", headers={"allow": allowed})


async def _read_body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise PluginError(400, "malformed_json", "the request ended early")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise PluginError(413, "request_too_large", f"the request exceeds {MAX_REQUEST_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _decode(raw: bytes) -> dict:
    try:
        request = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise PluginError(400, "malformed_json", "the request body is not JSON") from None
    if not isinstance(request, dict):
        raise PluginError(400, "malformed_json", "the request body is not a JSON object")
    return request


def _encode(body: dict) -> bytes:
    return msgspec.json.encode(body)


async def _respond(send: Send, status: int, body: dict, headers: dict[str, str]) -> None:
    payload = _encode(body)
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _innermost_frame(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""


# ---------------------------------------------------------------- serving


class ServeRefused(ValueError):
    """A start the plugin refuses before it listens."""


def serve(plugin: Plugin, host: str, port: int, token: str | None) -> None:
    """Listen until stopped. A non-loopback address needs the token: an open plugin on a network
    would answer anyone (decisions-part2, "Plugin processes")."""
    if not is_loopback(host) and not token:
        raise ServeRefused(f"--host {host} is not a loopback address: set CONTENTSVC_PLUGIN_TOKEN to serve on it")
    import uvicorn

    from contentsvc.processes.listener import PLUGIN, bind

    listener = bind(host, port, PLUGIN)  # CannotListen, before anything says it listens
    try:
        log.info("plugin_listening", plugin=plugin.plugin_id, host=host, port=port, token_required=bool(token),
                 manifest_digest=plugin.pinned.digest)
        config = uvicorn.Config(ProtocolApp(plugin, token), log_config=None, log_level="warning", access_log=False,
                                lifespan="on")
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
