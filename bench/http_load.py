"""A lean HTTP/1.1 client for the phases that time requests (single ingest, push).

httpx costs the bench about 1.5 ms of CPU per request (`client_cpu_s` in bench ingest), as much as
the API's own handling of a single ingest, on the same two cores; and its event loop's own delay
is added to every latency it measures. Here, as in wrk: keep-alive connections with one request
in flight on each, requests written as bytes, answers read by their Content-Length. What the
service does is the same whichever client sends; only the client's share of the machine shrinks.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec


class LoadError(Exception):
    """The connection failed or the answer was not HTTP/1.1 this client reads."""


@dataclass
class Answer:
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self):
        return msgspec.json.decode(self.content)


class _Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> Answer:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        try:
            self.writer.write(request)
            head = await self.reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            fields = {}
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                fields[name.strip().lower()] = value.strip()
            if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
                body = await self._chunked()
            else:
                body = await self.reader.readexactly(int(fields.get(b"content-length", b"0")))
            if fields.get(b"connection", b"").lower() == b"close":
                await self.close()
            return Answer(status, body)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            await self.close()
            raise LoadError(f"{type(exc).__name__}: {exc}") from None

    async def _chunked(self) -> bytes:
        chunks = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        await self.reader.readuntil(b"\r\n")  # no trailers are sent to us
        return b"".join(chunks)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


class LoadClient:
    """At most `connections` requests in flight, each on a keep-alive connection of its own."""

    def __init__(self, base_url: str, api_key: str, connections: int) -> None:
        url = urlsplit(base_url)
        self.authority = url.netloc
        self.headers = f"Host: {url.netloc}\r\nAuthorization: Bearer {api_key}\r\n".encode()
        self._idle: asyncio.Queue[_Connection] = asyncio.Queue()
        for _ in range(connections):
            self._idle.put_nowait(_Connection(url.hostname, url.port or 80))

    async def post(self, path: str, content: bytes, content_type: str = "application/json") -> Answer:
        return await self._send(b"POST " + path.encode() + b" HTTP/1.1\r\n" + self.headers
                                + f"Content-Type: {content_type}\r\nContent-Length: {len(content)}\r\n\r\n".encode()
                                + content)

    async def get(self, path: str) -> Answer:
        return await self._send(b"GET " + path.encode() + b" HTTP/1.1\r\n" + self.headers + b"\r\n")

    async def _send(self, request: bytes) -> Answer:
        connection = await self._idle.get()
        try:
            return await connection.send(request)
        finally:
            self._idle.put_nowait(connection)

    async def aclose(self) -> None:
        while not self._idle.empty():
            await self._idle.get_nowait().close()
