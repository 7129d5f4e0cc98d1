"""A webhook receiver on loopback, as a deployment's receiver would be: every request is verified
with the Standard Webhooks reference implementation (`standardwebhooks.Webhook(secret).verify`)
before anything else, and recorded. It can be told how to answer the next requests (a status,
headers, a delay), stopped (connection refused) and started again on the same port.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


@dataclass(frozen=True)
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay_seconds: float = 0.0  # held this long before answering


@dataclass
class Received:
    webhook_id: str
    timestamp: str
    body: bytes
    headers: dict[str, str]
    verified: bool
    error: str | None
    arrived: float  # time.monotonic()
    status: int


class WebhookReceiver:
    def __init__(self, secret: str, port: int = 0, default: Answer = Answer()) -> None:
        self.verifier = Webhook(secret)
        self.default = default
        self.script: list[Answer] = []
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()  # the most simultaneous requests seen per webhook-id
        self.httpd: ThreadingHTTPServer | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                receiver._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Close the listening socket: the next connection is refused."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None

    def answer_next(self, *answers: Answer) -> None:
        with self.lock:
            self.script.extend(answers)

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        expected = int(request.headers.get("content-length", "0"))
        body = request.rfile.read(expected)
        if len(body) < expected:
            # The sender went away mid-request (a killed deliveries worker): no request arrived, as
            # for any HTTP server; the attempt is redone once its lease expires.
            request.close_connection = True
            return
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            self.verifier.verify(body, headers)  # verified before parsing (part2 Events)
            verified, error = True, None
        except WebhookVerificationError as exc:
            verified, error = False, str(exc)
        webhook_id = headers.get("webhook-id", "")
        with self.lock:
            answer = self.script.pop(0) if self.script else self.default
            self.in_flight[webhook_id] += 1
            self.max_in_flight[webhook_id] = max(self.max_in_flight[webhook_id], self.in_flight[webhook_id])
            self.received.append(Received(webhook_id, headers.get("webhook-timestamp", ""), body, headers, verified,
                                          error, time.monotonic(), answer.status if verified else 401))
        try:
            if answer.delay_seconds:
                time.sleep(answer.delay_seconds)
            status = answer.status if verified else 401
            request.send_response(status)
            for name, value in answer.headers.items():
                request.send_header(name, value)
            request.send_header("content-length", str(len(answer.body)))
            request.end_headers()
            request.wfile.write(answer.body)
        except OSError:
            pass  # the sender went away
        finally:
            with self.lock:
                self.in_flight[webhook_id] -= 1

    def requests_for(self, webhook_id: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.webhook_id == webhook_id]
