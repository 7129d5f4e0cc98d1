"""The guards in front of a Connector's push routes and webhook relay (part 2 "Declared push
route" rules 3-12, "Webhook relay"; decisions-part2 "Push routes, relay, push_policy, proxies").
Pure, apart from the token buckets each API process holds in memory."""

from __future__ import annotations

import functools
import ipaddress
import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable

from contentsvc.domain.errors import ApiError
from contentsvc.plugins.manifest import PushRoute

MAX_BODY_BYTES = 1024 * 1024
MAX_QUERY_BYTES = 8192
MAX_PATH_CHARS = 8192
MAX_RELAYED_HEADERS = 64
NEVER_RELAYED = {"authorization", "cookie", "proxy-authorization", "connection", "keep-alive", "te", "trailer",
                 "transfer-encoding", "upgrade", "host", "content-length"}


def client_address(peer: str | None, forwarded_for: str | None, trusted: list[str]) -> str:
    """The socket peer, unless it is a trusted proxy: then X-Forwarded-For read right to left,
    skipping trusted addresses; the first untrusted one is the client."""
    networks = [ipaddress.ip_network(c, strict=False) for c in trusted]

    def is_trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in n for n in networks)

    address = peer or ""
    if not forwarded_for or not is_trusted(address):
        return address
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        address = hop
        if not is_trusted(hop):
            break
    return address


def check_allowed(address: str, allowed_cidrs: list[str] | None) -> None:
    if allowed_cidrs is None:
        return
    try:
        ip = ipaddress.ip_address(address)
        if any(ip in ipaddress.ip_network(c, strict=False) for c in allowed_cidrs):
            return
    except ValueError:
        pass
    raise ApiError(403, "ip_not_allowed", "The caller's address is outside the Connector's allowed_cidrs.")


def relayed_headers(headers: list[tuple[str, str]]) -> dict[str, str]:
    """Lowercase, the first 64 in arrival order, without credentials and hop-by-hop headers."""
    out: dict[str, str] = {}
    for name, value in headers:
        name = name.lower()
        if name in NEVER_RELAYED or name.startswith("proxy-") or name in out:
            continue
        if len(out) == MAX_RELAYED_HEADERS:
            break
        out[name] = value
    return out


def check_sizes(body_size: int, query: str) -> None:
    if body_size > MAX_BODY_BYTES:
        raise ApiError(413, "request_too_large", f"The body exceeds {MAX_BODY_BYTES} bytes.")
    if len(query.encode()) > MAX_QUERY_BYTES:
        raise ApiError(413, "request_too_large", f"The query exceeds {MAX_QUERY_BYTES} bytes.")


@functools.lru_cache(maxsize=1024)
def _template(path: str) -> re.Pattern:
    parts = [r"[^/]+" if re.fullmatch(r"\{\w+\}", segment) else re.escape(segment) for segment in path.split("/")]
    return re.compile("^" + "/".join(parts) + "$")


def resolve_route(routes: list[PushRoute], path: str, method: str) -> PushRoute:
    """The declared route of `path` (404 otherwise), accepting `method` (405 with Allow otherwise)."""
    path = path.lstrip("/")
    if len(path) > MAX_PATH_CHARS:
        raise ApiError(404, "not_found", "No such push route.")
    matching = [r for r in routes if _template(r.path).match(path)]
    if not matching:
        raise ApiError(404, "not_found", "No such push route.")
    for route in matching:
        if method in route.methods:
            return route
    allowed = sorted({m for r in matching for m in r.methods})
    raise ApiError(405, "method_not_allowed", f"This push route accepts {', '.join(allowed)}.",
                   headers={"Allow": ", ".join(allowed)})


def check_signature(headers: dict[str, str], route: PushRoute, now: float) -> str:
    """One non-empty signature header, and the signed timestamp (when declared) within the window;
    the plugin verifies the signature itself. Returns the signature."""
    signature = headers.get((route.signature_header or "").lower(), "").strip()
    if not signature:
        raise ApiError(401, "invalid_signature", f"The {route.signature_header} header is missing.")
    if route.timestamp_header:
        stamp = headers.get(route.timestamp_header.lower(), "").strip()
        if not stamp.isdigit() or abs(now - int(stamp)) > route.window_seconds:
            raise ApiError(401, "invalid_signature", f"The {route.timestamp_header} timestamp is missing or "
                                                     f"outside the {route.window_seconds} s window.")
    return signature


def check_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value.encode()) <= 256:
        raise ApiError(422, "invalid_input", "Idempotency-Key must be 1..256 bytes.", field="/Idempotency-Key")
    return value


@dataclass
class TokenBucket:
    rate: float
    burst: int
    tokens: float = -1.0
    updated: float = 0.0

    def take(self, now: float) -> float | None:
        """None when a token was taken; else the seconds until one is there."""
        if self.tokens < 0:
            self.tokens, self.updated = float(self.burst), now
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        return (1 - self.tokens) / self.rate


@dataclass
class RateLimits:
    """One bucket per Connector in this API process (N processes allow N times the rate)."""

    clock: Callable[[], float] = time.monotonic
    buckets: dict[str, TokenBucket] = field(default_factory=dict)

    def take(self, connector_id: str, rate: float, burst: int) -> None:
        bucket = self.buckets.get(connector_id)
        if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
            bucket = self.buckets[connector_id] = TokenBucket(rate, burst)
        wait = bucket.take(self.clock())
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            raise ApiError(429, "rate_limited", "Too many pushes to this Connector; retry later.", retryable=True,
                           headers={"Retry-After": str(seconds)})
