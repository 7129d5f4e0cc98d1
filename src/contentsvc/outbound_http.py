"""The HTTP client of the service's own outbound calls: plugin calls (evaluations, normalizations,
connector runs) through httpx, webhooks (the deliveries worker) through the same connection pool
without httpx's client around it (`outbound_pool`).

httpx over httpcore, with httpcore reaching the network through asyncio's streams rather than
anyio's. Before each request httpcore asks whether the pooled connection it is about to reuse
was closed by the other side; anyio answers from a dict of every attribute of the socket, built
anew on each question with a getpeername() system call among them. With asyncio's streams the
answer is what the reader already holds: the end of the stream, or bytes nobody asked for.
`contentsvc bench outbound` measures it: 0.62 instead of 0.90 ms of the caller's CPU per
webhook-sized POST at concurrency 8 on loopback (docs/decisions.md, "Outbound HTTP").

Errors are httpcore's, as its own backends raise them (httpx maps them to its exceptions): a
failed or timed-out connect or TLS handshake is ConnectError or ConnectTimeout with the cause
(an ssl.SSLError for a TLS failure) chained, a failed read or write ReadError or WriteError.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

# The pool httpx gives a client by default (its DEFAULT_LIMITS), whichever backend it reaches the network by.
POOL_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
# What httpcore may ask of a connection, by the name asyncio's transport gives it.
_EXTRA_INFO = {"ssl_object": "ssl_object", "client_addr": "sockname", "server_addr": "peername", "socket": "socket"}


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection, as asyncio's StreamReader and StreamWriter."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._writer.close()  # the transport closes on its own; nothing to wait for

    async def start_tls(self, ssl_context, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:  # ssl.SSLError among them; asyncio has closed the transport
            raise httpcore.ConnectError(str(exc)) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            # Asked of an idle pooled connection: whether the other side closed it, or sent
            # something unasked (a 408 before closing, say), either of which ends its reuse. The
            # transport reads eagerly, so what arrived is in the reader, not in the socket; the
            # reader has no public count of its unread bytes (`_buffer`, its bytearray since
            # Python 3.4; tests/integration/test_outbound_http.py holds both cases).
            return bool(self._reader._buffer) or self._reader.at_eof() or self._writer.transport.is_closing()
        name = _EXTRA_INFO.get(info)
        return None if name is None else self._writer.get_extra_info(name)


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend over asyncio.open_connection."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[tuple] | None = None) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        return await self._connect(asyncio.open_connection(host, port, local_addr=local), timeout, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[tuple] | None = None) -> httpcore.AsyncNetworkStream:
        return await self._connect(asyncio.open_unix_connection(path), timeout, socket_options)

    @staticmethod
    async def _connect(opening, timeout: float | None, socket_options: Iterable[tuple] | None) -> AsyncioStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await opening
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        for option in socket_options or ():
            writer.get_extra_info("socket").setsockopt(*option)
        return AsyncioStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@functools.cache
def verifying_context(trust_env: bool = True) -> ssl.SSLContext:
    """httpx's default SSL context (the system's or certifi's CA bundle), made once per process:
    loading the bundle costs 17-35 ms of CPU, which every client paid anew, the API's
    subscription previews once per request (the first-party connector plugins' fetches use it
    too). A context is shared safely by any number of connections."""
    return httpx.create_ssl_context(trust_env=trust_env)


def outbound_pool(*, verify: ssl.SSLContext | bool = True, trust_env: bool = True) -> httpcore.AsyncConnectionPool:
    """httpcore's connection pool on AsyncioBackend, with httpx's default limits: what every
    outbound client sends through, and what the deliveries worker sends through directly. A
    webhook needs none of httpx's request and response models (cookies, redirects, decoders), and
    skipping them took 0.44-0.49 instead of 0.65-0.74 ms of the caller's CPU per webhook-sized
    POST at concurrency 8 on loopback in `bench outbound` (docs/decisions.md, "Outbound HTTP")."""
    return httpcore.AsyncConnectionPool(
        ssl_context=verifying_context(trust_env) if verify is True else httpx.create_ssl_context(
            verify=verify, trust_env=trust_env),
        max_connections=POOL_LIMITS.max_connections,
        max_keepalive_connections=POOL_LIMITS.max_keepalive_connections,
        keepalive_expiry=POOL_LIMITS.keepalive_expiry,
        network_backend=AsyncioBackend(),
    )


def pool_headers(host: bytes, body: bytes, headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """A request's headers as the pool takes them: `headers` with the Host and Content-Length of a
    body sent whole, which httpx would otherwise add."""
    return [(b"host", host), (b"content-length", b"%d" % len(body))] + [
        (name.encode(), value.encode()) for name, value in headers.items()]


class AsyncioTransport(httpx.AsyncHTTPTransport):
    """httpx's HTTP/1.1 transport with its connection pool on AsyncioBackend."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, trust_env: bool = True) -> None:
        # Not AsyncHTTPTransport.__init__: all it does is build the pool this one replaces
        # (loading the CA bundle a second time). Its request handling and exception mapping are kept.
        self._pool = outbound_pool(verify=verify, trust_env=trust_env)


def outbound_client(*, verify: ssl.SSLContext | bool = True, trust_env: bool = True,
                    **options: Any) -> httpx.AsyncClient:
    """An httpx.AsyncClient on AsyncioTransport; `options` are AsyncClient's (timeout, follow_redirects ...)."""
    return httpx.AsyncClient(transport=AsyncioTransport(verify=verify, trust_env=trust_env), trust_env=trust_env,
                             **options)
