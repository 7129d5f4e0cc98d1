"""The bench's webhook receiver on 127.0.0.1: a minimal HTTP/1.1 keep-alive server on the bench's
event loop that records (webhook-id, arrival time, body) and answers 200 at once, so that it is
never what limits the deliveries. Every `VERIFY_EVERY`th arrival's signature is checked on
arrival with the Standard Webhooks reference implementation (as a deployment's receiver would)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
MAX_HEADER_BYTES = 64 * 1024
VERIFY_EVERY = 10  # a sample: an HMAC per request is cheap, but the receiver must never be the limit


@dataclass
class Arrival:
    webhook_id: str
    arrived: float  # time.time(), comparable with the ingest's clock
    body: bytes
    headers: dict[str, str]


class Receiver:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.arrivals: list[Arrival] = []
        self.malformed = 0
        self.verified = 0
        self.verification_failures = 0
        self._verifier = Webhook(secret)
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > MAX_HEADER_BYTES:
                    self.malformed += 1
                    return
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.arrivals.append(Arrival(headers.get("webhook-id", ""), time.time(), body, headers))
                if len(self.arrivals) % VERIFY_EVERY == 1:
                    self._verify(body, headers)
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            self.malformed += 1
        except asyncio.CancelledError:
            return  # the receiver stops with keep-alive connections still open: nothing went wrong
        finally:
            writer.close()

    def _verify(self, body: bytes, headers: dict[str, str]) -> None:
        try:
            self._verifier.verify(body, {k: v for k, v in headers.items() if k.startswith("webhook-")})
            self.verified += 1
        except WebhookVerificationError:
            self.verification_failures += 1
