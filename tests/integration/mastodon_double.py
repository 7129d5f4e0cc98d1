"""A test double of the Mastodon list-timeline API on loopback, in a thread: real HTTP, real
JSON statuses, Bearer token checked, `min_id`/`limit` paging as the instance does it (the
`limit` statuses immediately newer than `min_id`, newest first; without `min_id` the newest)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from tests.integration.loopback_server import LoopbackServer

TOKEN = "fixture-social-token-1"  # the shipped social_list fixture's token
FIXTURE_PORT = 8196  # the port the shipped social_list fixture names
LIST_ID = "harbour"


def status(n: int, *, edited: bool = False, spoiler: str = "", content: str | None = None) -> dict:
    return {"id": str(100000 + n), "uri": f"https://social.example/users/harbour/statuses/{100000 + n}",
            "created_at": f"2026-03-01T{n // 60:02d}:{n % 60:02d}:00.000Z",
            "edited_at": "2026-03-02T08:00:00.000Z" if edited else None, "spoiler_text": spoiler,
            "content": content if content is not None else f"<p>Harbour notice <b>{n}</b></p>", "reblog": None}


class MastodonDouble(LoopbackServer):
    fixture_port = FIXTURE_PORT

    def __init__(self, port: int = 0, statuses: int = 45):
        self.lists: dict[str, list[dict]] = {LIST_ID: [status(n) for n in range(1, statuses + 1)]}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.fail_with: int | None = None  # answer every request with this status (Retry-After 9)
        handler = type("Handler", (_Handler,), {"double": self})
        self._listen(port, handler)


class _Handler(BaseHTTPRequestHandler):
    double: MastodonDouble

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        double = self.double
        url = urlsplit(self.path)
        double.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        if double.fail_with is not None:
            return self._json(double.fail_with, {"error": "unavailable"}, {"retry-after": "9"})
        if self.headers.get("authorization") != f"Bearer {TOKEN}":
            return self._json(401, {"error": "The access token is invalid"})
        segments = url.path.strip("/").split("/")
        if segments[:3] == ["api", "v1", "lists"] and len(segments) == 4:
            if segments[3] not in double.lists:
                return self._json(404, {"error": "Record not found"})
            return self._json(200, {"id": segments[3], "title": segments[3], "replies_policy": "list"})
        if segments[:4] == ["api", "v1", "timelines", "list"] and len(segments) == 5:
            if segments[4] not in double.lists:
                return self._json(404, {"error": "Record not found"})
            query = parse_qs(url.query)
            limit = min(40, int(query.get("limit", ["20"])[0]))
            ordered = sorted(double.lists[segments[4]], key=lambda s: int(s["id"]))
            if "min_id" in query:
                newer = [s for s in ordered if int(s["id"]) > int(query["min_id"][0])][:limit]
            else:
                newer = ordered[-limit:]
            return self._json(200, list(reversed(newer)))
        return self._json(404, {"error": "Not found"})

    def _json(self, code: int, body: object, headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode()
        try:
            self.send_response(code)
            self.send_header("content-type", "application/json")
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass


if __name__ == "__main__":  # `python -m tests.integration.mastodon_double`: the instance the shipped fixture reads
    MastodonDouble(FIXTURE_PORT)
    threading.Event().wait()
