"""A threaded HTTP server on loopback for the test doubles of outside sources (feeds, a
Mastodon instance): listening, the fixed port the shipped fixtures name, stopping."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer:
    fixture_port: int  # the port the shipped plugin fixtures name

    def _listen(self, port: int, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @classmethod
    def on_fixture_port_or_any(cls):
        """On the fixtures' port when it is free, else on any port (the test then points a copy
        of the fixtures at it)."""
        try:
            return cls(cls.fixture_port)
        except OSError:
            return cls(0)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
