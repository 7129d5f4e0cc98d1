"""The one HTTP client the service uses to call plugins, whatever the role (normalizer,
subscription evaluator, connector, ingestion, retrieval, the contract check).

decisions-part2, "How the service calls plugins":

- every call carries `Authorization: Bearer <token>` when the registration has a token,
  `Content-Type: application/json`, `User-Agent: contentsvc/<version>` and
  `X-Contentsvc-Invocation-Id`;
- before first use and after every connection failure it reads `/v0/discovery`; an answer
  whose plugin id, version or manifest digest differs from the pinned registration makes
  the plugin unreachable until it matches;
- unreachable = connect failure, timeout, or a non-2xx answer without the plugin error
  body; a non-2xx answer with the body is the plugin's own error, whose `retryable` is
  authoritative (connector errors add `error_class`, `retry_after_seconds`);
- retries back off 1, 2, 4 ... 60 seconds with jitter (`backoff_delay`).

Nothing here logs a token or a body.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import httpx
import msgspec

from contentsvc import __version__
from contentsvc.config.limits import MAX_CONNECTOR_INTERVAL_SECONDS
from contentsvc.ids import new_id
from contentsvc.logging import get_logger
from contentsvc.outbound_http import outbound_client
from contentsvc.storage.text import storable

log = get_logger("contentsvc.plugins.client")

USER_AGENT = f"contentsvc/{__version__}"
DISCOVERY_TIMEOUT_SECONDS = 5.0
BACKOFF_CAP_SECONDS = 60.0
BACKOFF_JITTER = 0.1  # each delay x U(0.9, 1.1), as the delivery schedule's jitter
MAX_ERROR_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class PluginTarget:
    """Who is called and what build it must be: a registration's pinned identity."""

    plugin_id: str
    version: str
    manifest_digest: str
    endpoint: str  # base URL; the protocol's routes are under its /v0
    token: str | None = field(default=None, repr=False)

    def url(self, route: str) -> str:
        return self.endpoint.rstrip("/") + "/v0/" + route.lstrip("/")


@dataclass(frozen=True)
class Discovery:
    plugin_api: str
    plugin_id: str
    version: str
    manifest_digest: str
    contributions: list[str]


class PluginCallError(Exception):
    """A call that did not give an answer to use."""


class PluginUnreachable(PluginCallError):
    """Connect failure, timeout, a non-2xx answer without the error body, or discovery naming another
    build: retried with backoff, and part 1's `plugin_unavailable` meanwhile. `cause` is a short code
    (`connect`, `timeout`, `unexpected_status`, `unauthorized`, `invalid_discovery`,
    `identity_mismatch`, `digest_mismatch`, `invalid_response`)."""

    def __init__(self, cause: str, message: str, status: int | None = None):
        message = storable(message)  # a plugin's words, stored in diagnostics
        super().__init__(message)
        self.cause = cause
        self.message = message
        self.status = status


class PluginFailed(PluginCallError):
    """The plugin answered with its error body: `retryable` decides whether to try again."""

    def __init__(self, status: int, code: str, message: str, retryable: bool, error_class: str | None = None,
                 retry_after_seconds: int | None = None):
        code, message = storable(code), storable(message)  # stored in diagnostics, last errors
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.error_class = error_class
        self.retry_after_seconds = retry_after_seconds


def plugin_error(status: int, body: object) -> PluginFailed | None:
    """The plugin error body of a non-2xx answer, or None when it is not one: part 1's Error object
    (`code`, `message`, `retryable`), plus `error_class` and `retry_after_seconds`. An `{error: {...}}`
    wrapping is accepted too, so a plugin framework that wraps errors is still understood."""
    if isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict):
        body = body["error"]
    if not isinstance(body, dict):
        return None
    code, message, retryable = body.get("code"), body.get("message"), body.get("retryable")
    if not (isinstance(code, str) and code and isinstance(message, str) and isinstance(retryable, bool)):
        return None
    error_class = body.get("error_class") if isinstance(body.get("error_class"), str) else None
    return PluginFailed(status, code, message, retryable, error_class, retry_after(body.get("retry_after_seconds")))


def retry_after(value: object) -> int | None:
    """A plugin's `retry_after_seconds` (an integer >= 1) as the service keeps it: at most a day, the
    longest schedule interval (one past an integer's range failed the run's last update, and the run
    stayed `running`); None when it is not one."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return None
    return min(value, MAX_CONNECTOR_INTERVAL_SECONDS)


def backoff_delay(attempt: int, unit: float) -> float:
    """Seconds to wait before retry number `attempt` (1 = the first retry): 1, 2, 4 ... capped at
    60, each times a jitter factor in [0.9, 1.1] drawn from `unit` in [0, 1], never above the cap.
    Pure, so the schedule is tested without sleeping."""
    base = min(BACKOFF_CAP_SECONDS, 2.0 ** min(max(attempt, 1) - 1, 16))
    factor = 1.0 - BACKOFF_JITTER + 2 * BACKOFF_JITTER * min(max(unit, 0.0), 1.0)
    return min(BACKOFF_CAP_SECONDS, base * factor)


def random_backoff_delay(attempt: int) -> float:
    return backoff_delay(attempt, random.random())


class PluginClient:
    """Calls one plugin. Keeps whether its discovery has been verified since the last connection
    failure; share one per pinned target (PluginClients) so that state is shared too."""

    def __init__(self, target: PluginTarget):
        self.target = target
        self.http = outbound_client()
        self.verified = False

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> PluginClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def _headers(self, invocation_id: str | None = None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if invocation_id is not None:
            headers["X-Contentsvc-Invocation-Id"] = invocation_id
        if self.target.token:
            headers["Authorization"] = f"Bearer {self.target.token}"
        return headers

    async def _send(self, method: str, route: str, timeout: float, invocation_id: str | None = None,
                    body: dict | None = None) -> httpx.Response:
        try:
            if body is None:
                return await self.http.request(method, self.target.url(route), headers=self._headers(invocation_id),
                                               timeout=timeout)
            # msgspec rather than httpx's json=: an evaluator request can be hundreds of KiB.
            headers = self._headers(invocation_id) | {"Content-Type": "application/json"}
            return await self.http.request(method, self.target.url(route), content=msgspec.json.encode(body),
                                           headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            self.verified = False
            raise PluginUnreachable("timeout", f"{self.target.plugin_id} did not answer {route} within {timeout} s") \
                from None
        except httpx.HTTPError as exc:
            self.verified = False
            raise PluginUnreachable("connect", f"{self.target.plugin_id} at {self.target.endpoint}: "
                                               f"{type(exc).__name__}") from None

    async def discover(self, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
        """`/v0/discovery` as the plugin answers it, without comparing it to the pin."""
        response = await self._send("GET", "discovery", timeout)
        answer = _json_object(response)
        if response.status_code != 200:
            # A plugin that will not say which build it is cannot be used: unreachable, whatever its reason
            # (a wrong token included), so pinned work waits and retries instead of failing for good.
            error = plugin_error(response.status_code, answer)
            said = f" {error.code}: {error.message}" if error else " without the plugin error body"
            cause = "unauthorized" if response.status_code == 401 else "unexpected_status"
            raise PluginUnreachable(cause, f"{self.target.plugin_id} answered discovery with "
                                           f"{response.status_code}{said}", response.status_code)
        try:
            plugin = answer["plugin"]
            named = (answer["plugin_api"], plugin["id"], plugin["version"], answer["manifest_digest"])
            if not all(isinstance(v, str) for v in named):
                raise TypeError
            # What the build names is quoted in check reports and errors, which are stored.
            found = Discovery(*map(storable, named), contributions=[
                storable(c) if isinstance(c, str) else c for c in list(answer["contributions"])])
        except (KeyError, TypeError):
            raise PluginUnreachable("invalid_discovery", f"{self.target.plugin_id}: discovery answer lacks "
                                                         "plugin_api, plugin {id, version}, manifest_digest "
                                                         "or contributions", response.status_code) from None
        return found

    async def verify(self, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> Discovery:
        """Discovery compared with the pinned build; a different build is unreachable until it matches."""
        found = await self.discover(timeout)
        target = self.target
        if (found.plugin_id, found.version) != (target.plugin_id, target.version):
            self.verified = False
            raise PluginUnreachable("identity_mismatch", f"{target.endpoint} serves {found.plugin_id} "
                                                         f"{found.version}, not {target.plugin_id} {target.version}")
        if found.manifest_digest != target.manifest_digest:
            self.verified = False
            raise PluginUnreachable("digest_mismatch", f"{target.plugin_id} {target.version} reports manifest "
                                                       f"digest {found.manifest_digest}, the pin is "
                                                       f"{target.manifest_digest}")
        self.verified = True
        return found

    async def health(self, timeout: float = DISCOVERY_TIMEOUT_SECONDS) -> dict:
        """200 `{status: ok}`; a 503 with the error body is PluginFailed, anything else unreachable."""
        response = await self._send("GET", "health", timeout)
        answer = _json_object(response)
        if response.status_code != 200:
            raise _refusal(response, answer, "health")
        return answer if answer is not None else {}

    async def invoke(self, route: str, body: dict, timeout: float, invocation_id: str | None = None) -> dict:
        """POST a contribution route (`normalizer`, `subscription`, `connector/fetch`, ...) and return the
        plugin's answer; PluginFailed for its error body, PluginUnreachable otherwise."""
        response = await self.relay(route, body, timeout, invocation_id)
        answer = _json_object(response)
        if not 200 <= response.status_code < 300:
            raise _refusal(response, answer, route)
        if answer is None:
            raise PluginUnreachable("invalid_response", f"{self.target.plugin_id} answered {route} with "
                                                        "something that is not a JSON object", response.status_code)
        return answer

    async def relay(self, route: str, body: dict, timeout: float, invocation_id: str | None = None) -> httpx.Response:
        """POST a contribution route and return the plugin's answer as it came, 2xx or not (a push
        relays a plugin's refusal to the source unchanged, part 2 "Declared push route" rule 8);
        PluginUnreachable when there is no answer at all."""
        if not self.verified:
            await self.verify(min(timeout, DISCOVERY_TIMEOUT_SECONDS))
        invocation_id = invocation_id or body.get("invocation_id") or new_id("inv")
        started = time.monotonic()
        status: int | str = "unreachable"
        try:
            response = await self._send("POST", f"contributions/{route}", timeout, invocation_id, body)
            status = response.status_code
            return response
        finally:
            # decisions-part2 "Logging": plugin, contribution, invocation_id, status, duration; never bodies.
            log.info("plugin_invocation", plugin=self.target.plugin_id, version=self.target.version,
                     contribution=route, invocation_id=invocation_id, status=status,
                     duration_ms=round((time.monotonic() - started) * 1000, 1))


class PluginClients:
    """One PluginClient per pinned target (a registration's endpoint, token and build), kept as long
    as its holder (a worker, or an API process), so that its pooled connections and its verified
    discovery serve every later call."""

    def __init__(self) -> None:
        self._clients: dict[PluginTarget, PluginClient] = {}

    def client(self, target: PluginTarget) -> PluginClient:
        client = self._clients.get(target)
        if client is None:
            client = self._clients[target] = PluginClient(target)
        return client

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


# The clients an API process's routes share (push relays, subscription previews), kept for the
# process's life: a push then costs no TCP connect and no discovery call, and a preview (which
# reads discovery before its calls) no TCP connect.
ROUTE_CLIENTS = PluginClients()


def _json_object(response: httpx.Response) -> dict | None:
    try:
        answer = msgspec.json.decode(response.content)
    except msgspec.DecodeError:
        return None
    return answer if isinstance(answer, dict) else None


def _refusal(response: httpx.Response, answer: dict | None, route: str) -> PluginCallError:
    error = plugin_error(response.status_code, answer)
    if error is not None:
        return error
    return PluginUnreachable("unexpected_status", f"{route} answered {response.status_code} without the plugin "
                                                  "error body", response.status_code)
