"""The `deliveries` worker (decisions-part2, "Deliveries"; design.md, "Part 2"): sends each due
Delivery's notice to its destination as a Standard Webhooks POST, at least once.

The worker keeps up to `[deliveries] concurrency` attempts in flight. Each step waits for the
first of the sends in flight to end (and a few milliseconds for those close behind it), then in
one transaction records every attempt ended by then and claims as many due Deliveries as there
are free slots (one journal append for all their `delivery.changed`; row locks with SKIP LOCKED
and a lease of the attempt timeout + 5 s: two worker processes never attempt the same Delivery at
once, so several may run), and sends the claims with no transaction open: a slow receiver holds
its own slot, never the others'. Should that transaction raise (nothing of it is written), the
outcomes are recorded one by one, so a bad one costs only itself: it is logged and left
unrecorded, and its lease expires. A worker killed between the send and the record leaves a lease that expires; the
attempt is then sent again by any worker, with the same body and `webhook-id` (the receiver
deduplicates).

Redirects are not followed (a 3xx is a failed attempt). The whole attempt, connection to the
first 512 bytes of the answer, is bounded by `attempt_timeout_seconds`. Logged per attempt:
delivery_id, number, status_code, error_code, duration_ms; never a header, a body or a secret.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from datetime import datetime, timezone

import httpcore
import httpx
import psycopg
from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.logging import get_logger
from contentsvc.monitoring import deliveries
from contentsvc.monitoring.deliveries import EXCERPT_BYTES, Claim, Outcome
from contentsvc.monitoring.webhooks import request_headers
from contentsvc.outbound_http import outbound_pool, pool_headers
from contentsvc.projectors.base import Projector, counted, oldest_due
from contentsvc.projectors.runner import connection_lost

log = get_logger("contentsvc.deliveries")

IDLE_POLL_CAP_SECONDS = 1.0  # without a commit to wake it, the worker looks again at least this often
COLLECT_SECONDS = 0.003  # after a send ends, how long the step waits for the others close behind it
DESTINATION_RECHECK_SECONDS = 5.0  # how often held destination_unconfigured Deliveries are looked at
UNRECORDED = "unrecorded"  # an outcome whose own recording raised: its lease expires, the attempt is redone


def _tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class DeliveriesWorker(Projector):
    name = "deliveries"
    # Woken by every commit (wakes_on stays None): listening to its families alone measured 30 %
    # fewer deliveries per second in `bench monitoring`'s burst.
    single_instance = False  # leases share the work: any number may run

    @staticmethod
    def waiting(conn: psycopg.Connection) -> str:
        # A held Delivery (its Subscription disabled or deleted, its destination unconfigured) waits
        # for no worker: it is counted apart from the ones the workers will attempt.
        pending, due, held, late = conn.execute(
            "SELECT count(*) FILTER (WHERE held IS NULL), count(*) FILTER (WHERE held IS NULL AND next_attempt_at <= now()),"
            " count(*) FILTER (WHERE held IS NOT NULL),"
            " now() - min(next_attempt_at) FILTER (WHERE held IS NULL AND next_attempt_at <= now())"
            " FROM deliveries WHERE state = 'pending'").fetchone()
        return f"{counted(pending, 'delivery', 'deliveries')} pending ({due:,} due{oldest_due(late)}), {held:,} held"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.delivery_settings = settings.deliveries
        self.pool: httpcore.AsyncConnectionPool | None = None
        self._targets: dict[str, tuple[httpcore.URL, bytes]] = {}  # destination_id -> (URL, Host header)
        self._idle_poll: float | None = None
        self._destinations_checked = 0.0
        self._in_flight: dict[asyncio.Task[Outcome], Claim] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> "DeliveriesWorker":
        return cls(settings)

    @property
    def configured(self) -> set[str]:
        return set(self.settings.destinations)

    async def open(self, conn: AsyncConnection) -> None:
        self._connection_pool()

    def _connection_pool(self) -> httpcore.AsyncConnectionPool:
        if self.pool is None:
            self.pool = outbound_pool(trust_env=False)
        return self.pool

    def _target(self, destination_id: str) -> tuple[httpcore.URL, bytes]:
        """Where a destination's POSTs go, and their Host header (httpx's URL parsing: IDNA, IPv6)."""
        if destination_id not in self._targets:
            url = httpx.URL(self.settings.destinations[destination_id].url)
            self._targets[destination_id] = (httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                                          target=url.raw_path), url.netloc)
        return self._targets[destination_id]

    async def close(self) -> None:
        # Attempts still in flight are abandoned unrecorded: their leases expire and they are redone.
        for task in self._in_flight:
            task.cancel()
        self._in_flight.clear()
        if self.pool is not None:
            await self.pool.aclose()
            self.pool = None

    def idle_poll_seconds(self) -> float | None:
        return self._idle_poll

    async def step(self, conn: AsyncConnection) -> bool:
        if time.monotonic() >= self._destinations_checked + DESTINATION_RECHECK_SECONDS:
            await deliveries.release_configured_destinations(conn, self.configured)
            self._destinations_checked = time.monotonic()
        ended = await self._ended_sends()
        free = self.delivery_settings.concurrency - len(self._in_flight)
        claims = await self.record(conn, ended, free)
        for claim in claims:  # every transaction is closed here: the sends run outside the database
            self._in_flight[asyncio.create_task(self.send(claim))] = claim
        if self._in_flight:
            return True
        due_in = await deliveries.next_due_in(conn)
        self._idle_poll = IDLE_POLL_CAP_SECONDS if due_in is None else min(max(due_in, 0.05), IDLE_POLL_CAP_SECONDS)
        return len(claims) == free

    async def _ended_sends(self) -> list[tuple[Claim, Outcome]]:
        """The sends ended by the first end (or the idle poll, to claim what became due meanwhile),
        with those ending within COLLECT_SECONDS of it: a fast receiver answers the slots at
        nearly the same moment, and one transaction then records them all."""
        if not self._in_flight:
            return []
        done, pending = await asyncio.wait(self._in_flight, timeout=IDLE_POLL_CAP_SECONDS,
                                           return_when=asyncio.FIRST_COMPLETED)
        if done and pending:
            done |= (await asyncio.wait(pending, timeout=COLLECT_SECONDS))[0]
        return [(self._in_flight.pop(task), task.result()) for task in done]

    async def record(self, conn: AsyncConnection, ended: list[tuple[Claim, Outcome]], free: int) -> list[Claim]:
        """The ended attempts and the next claims in one transaction; if it raises, the outcomes
        one by one and then the claims on their own (see the module doc). The new claims."""
        try:
            states, claims = await deliveries.record_and_claim(conn, ended, self.delivery_settings,
                                                               self.configured, free)
        except Exception as exc:
            if isinstance(exc, psycopg.Error) and connection_lost(exc):
                raise  # an outage: the runner waits it out; the leases expire and the attempts are redone
            if not ended:
                raise
            log.warning("delivery_batch_record_failed", attempts=len(ended), error=type(exc).__name__)
            states = [await self._record_one(conn, claim, outcome) for claim, outcome in ended]
            claims = await deliveries.claim_due(conn, self.delivery_settings, self.configured, free) if free else []
        for (claim, outcome), state in zip(ended, states):
            if state is UNRECORDED:
                continue
            log.info("delivery_attempt", delivery_id=claim.delivery_id, number=claim.number,
                     status_code=outcome.status_code, error_code=outcome.error_code,
                     duration_ms=outcome.duration_ms, state=state, lease_lost=state is None)
        return claims

    async def _record_one(self, conn: AsyncConnection, claim: Claim, outcome: Outcome) -> str | None:
        try:
            return await deliveries.record_attempt(conn, claim, outcome, self.delivery_settings)
        except Exception as exc:
            if isinstance(exc, psycopg.Error) and connection_lost(exc):
                raise
            log.error("delivery_record_failed", delivery_id=claim.delivery_id, number=claim.number,
                      error=type(exc).__name__)
            return UNRECORDED

    async def send(self, claim: Claim) -> Outcome:
        """One attempt: POST the stored body, signed now; what came back, never what was sent."""
        destination = self.settings.destinations[claim.destination_id]
        url, host = self._target(claim.destination_id)
        headers = pool_headers(host, claim.body, request_headers(destination, claim.event_id, int(time.time()),
                                                                 claim.body))
        bound = self.delivery_settings.attempt_timeout_seconds
        started = datetime.now(timezone.utc)
        status_code = error_code = retry_after = None
        received = b""
        timeouts = {"connect": bound, "read": bound, "write": bound, "pool": bound}
        try:
            async with asyncio.timeout(bound):
                async with self._connection_pool().stream(b"POST", url, headers=headers, content=claim.body,
                                                          extensions={"timeout": timeouts}) as response:
                    status_code = response.status
                    if not 200 <= status_code < 300:
                        error_code = "http_status"
                        retry_after = _header(response.headers, b"retry-after")
                    async for chunk in response.aiter_stream():
                        received += chunk
                        if len(received) >= EXCERPT_BYTES:
                            break
        except (TimeoutError, httpcore.TimeoutException):
            error_code = "timeout"
        except httpcore.ConnectError as exc:
            error_code = "tls_error" if _tls_failure(exc) else "connect_error"
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            error_code = "tls_error" if _tls_failure(exc) else "invalid_response"  # a broken or unreadable answer
        finished = datetime.now(timezone.utc)
        if status_code is not None and 200 <= status_code < 300:
            error_code = None  # a 2xx status line is the receiver's acceptance, whatever its body did next
        return Outcome(started_at=started, finished_at=finished, status_code=status_code, error_code=error_code,
                       response_excerpt=deliveries.excerpt(received), retry_after=retry_after)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """A response header's first value (`name` in lower case), decoded as Latin-1 as HTTP allows."""
    return next((value.decode("latin-1") for key, value in headers if key.lower() == name), None)
