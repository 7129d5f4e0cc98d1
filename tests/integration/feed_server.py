"""A real HTTP server on loopback for the connector plugin tests, in a thread: the sample feeds of
tests/fixtures/feeds with ETag and Last-Modified (and 304s), plus redirects, refusals and an
authenticated feed. It records each request's headers so a test can see what the plugin sent."""

from __future__ import annotations

import hashlib
import socket
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.integration.loopback_server import LoopbackServer

FEEDS = Path(__file__).resolve().parents[1] / "fixtures" / "feeds"
FIXTURE_PORT = 8193  # the port the shipped rss fixtures name
LAST_MODIFIED = formatdate(1772524800, usegmt=True)  # fixed: the files' content is what changes, not their date
CONTENT_TYPES = {".rss": "application/rss+xml", ".rdf": "application/rdf+xml", ".atom": "application/atom+xml",
                 ".json": "application/feed+json", ".html": "text/html; charset=utf-8"}


class FeedServer(LoopbackServer):
    fixture_port = FIXTURE_PORT

    def __init__(self, port: int = 0):
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.overrides: dict[str, bytes] = {}  # path -> body, to change a feed between fetches
        self.content_types: dict[str, str] = {}  # path -> Content-Type, to have a server mislabel a feed
        self.expected_authorization: str | None = None
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._listen(port, handler)


class _Handler(BaseHTTPRequestHandler):
    server_state: FeedServer

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        state = self.server_state
        state.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        path = self.path.split("?", 1)[0]
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
            self._answer(status, b"", {"retry-after": "7"} if status in (429, 503) else {})
        elif path.startswith("/redirect/"):
            _, _, hops, rest = path.split("/", 3)
            target = f"/redirect/{int(hops) - 1}/{rest}" if int(hops) > 1 else f"/{rest}"
            self._answer(302, b"", {"location": target})
        elif path.startswith("/auth/"):
            if self.headers.get("authorization") != state.expected_authorization:
                self._answer(401, b"", {"www-authenticate": "Basic"})
            else:
                self._feed(path[len("/auth"):])
        elif path.startswith("/slow/"):
            threading.Event().wait(5)
            self._feed(path[len("/slow"):])
        else:
            self._feed(path)

    def _feed(self, path: str) -> None:
        body = self.server_state.overrides.get(path)
        file = FEEDS / path[len("/feeds/"):] if path.startswith("/feeds/") else None
        if body is None and (file is None or not file.is_file()):
            self._answer(404, b"", {})
            return
        body = body if body is not None else file.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        headers = {"etag": etag, "last-modified": LAST_MODIFIED,
                   "content-type": self.server_state.content_types.get(
                       path, CONTENT_TYPES.get(Path(path).suffix, "application/xml"))}
        if self.headers.get("if-none-match") == etag:
            self._answer(304, b"", headers)
        else:
            self._answer(200, body, headers)

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        try:
            self.send_response(status)
            for name, value in headers.items():
                if not (status == 304 and name == "content-type"):
                    self.send_header(name, value)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a client that gave up waiting (the timeout test) is not the server's failure


def a_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
