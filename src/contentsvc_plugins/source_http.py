"""What the connector plugins share about reading a source over HTTP: the connector error body
(decisions-part2: class access for 401/403, source for a source that is gone or refused,
transient for 5xx, 429 and timeouts with `retry_after_seconds` from Retry-After), and the
address guard of the `rss` kind."""

from __future__ import annotations

import ipaddress
import math
import socket
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

import httpx

from contentsvc_plugins.server import PluginError

DEFAULT_RETRY_AFTER_SECONDS = 60  # a transient failure without Retry-After defers the next run this long
MAX_RETRY_AFTER_SECONDS = 86400


def access_error(code: str, message: str) -> PluginError:
    return PluginError(502, code, message, retryable=False, error_class="access")


def source_error(code: str, message: str) -> PluginError:
    return PluginError(502, code, message, retryable=False, error_class="source")


def transient_error(code: str, message: str, retry_after_seconds: int = DEFAULT_RETRY_AFTER_SECONDS) -> PluginError:
    return PluginError(503, code, message, retryable=True, error_class="transient",
                       retry_after_seconds=retry_after_seconds)


def status_error(status: int, headers: httpx.Headers, what: str) -> PluginError:
    """The connector error for a source answer that carries no content."""
    code = f"http_{status}"
    if status in (401, 403):
        return access_error(code, f"{what} refused access ({status})")
    if status == 429 or status >= 500:
        return transient_error(code, f"{what} answered {status}", retry_after(headers.get("retry-after")))
    return source_error(code, f"{what} answered {status}")


def retry_after(value: str | None, now: datetime | None = None) -> int:
    """Retry-After as whole seconds >= 1: delta-seconds or an HTTP date."""
    if not value:
        return DEFAULT_RETRY_AFTER_SECONDS
    value = value.strip()
    if value.isdigit():
        seconds = int(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return DEFAULT_RETRY_AFTER_SECONDS
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = math.ceil((when - (now or datetime.now(UTC))).total_seconds())
    return min(MAX_RETRY_AFTER_SECONDS, max(1, seconds))


def network_error(exc: httpx.HTTPError, what: str) -> PluginError:
    if isinstance(exc, httpx.TimeoutException):
        return transient_error("timeout", f"{what} did not answer in time")
    return transient_error("connection_failed", f"{what} could not be reached: {type(exc).__name__}")


def _forbidden(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    # is_private covers the private ranges and IPv6 unique-local fc00::/7; an unspecified
    # address connects to this machine, so it counts as loopback.
    return address.is_loopback or address.is_private or address.is_link_local or address.is_unspecified


def guard_address(url: str) -> None:
    """decisions-part2 rss: resolve the host and refuse loopback, private, link-local and
    unique-local addresses (every address the name resolves to)."""
    parts = urlsplit(url)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise source_error("invalid_url", "the feed address is not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        resolved = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise transient_error("dns_failed", f"the host {host} does not resolve") from None
    for *_, sockaddr in resolved:
        address = ipaddress.ip_address(sockaddr[0].split("%", 1)[0])
        if _forbidden(address):
            raise source_error("address_not_allowed",
                               f"the host {host} resolves to {address}, a loopback, private or link-local address")
