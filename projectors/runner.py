"""The process every projector runs: `contentsvc projector run NAME`.

One instance per projector holds a session advisory lock; a second one
waits (a worker whose work is shared out by row leases, `single_instance`
False, takes no lock: several run side by side). The loop folds a batch (projectors/base.py: the output and the
checkpoint commit together), and when the journal has nothing more it
waits for a commit notification, polling as a fallback.

A lost database is an outage to wait out, not a crash: the runner logs
`database_unavailable` once (process `projector:NAME`), retries with
exponential backoff, logs `database_available` when it is connected and
holds the lock again, and reopens the fold (memory may be ahead of what
committed before the outage; reopening reads it back from Postgres, as a
restart would). Its connection gives up connecting after the configured
connect_timeout and carries no statement timeout (a fold may be long).

Any other failure of a step is a fault: recorded, retried with backoff one event at a time, and
cleared once a step gets past it (projectors/faults.py). The process stays up and holds its
place; nothing is skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
from psycopg import AsyncConnection

from contentsvc.config.settings import DatabaseSettings
from contentsvc.journal.store import NOTIFY_CHANNEL
from contentsvc.logging import get_logger
from contentsvc.projectors import faults
from contentsvc.projectors.base import Projector
from contentsvc.storage.availability import OutageLog, connection_options, unreachable
from contentsvc.storage.heap import freeze_start_up_heap
from contentsvc.storage.server_settings import keep_commits_durable

log = get_logger("contentsvc.projector")

# Retry delays while the database is away: 0.25 s, doubling, at most this.
RETRY_FIRST_SECONDS = 0.25
RETRY_CAP_SECONDS = 10.0


def instance_lock_id(name: str) -> int:
    """The session advisory lock a single-instance projector holds while it runs."""
    return int.from_bytes(hashlib.sha256(f"projector:{name}".encode()).digest()[:7], "big")


def runner_application_name(name: str) -> str:
    """The application_name of the connection the runner folds on (`worker status` counts them)."""
    return f"contentsvc projector {name}"


def connection_lost(exc: BaseException) -> bool:
    """The server went away or refused us (shutdown, terminated backend, network): worth
    waiting out. Any other database error is a bug or a conflict: a fault (projectors/faults.py)."""
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and unreachable(exc)


@asynccontextmanager
async def _connection(url: str, projector: Projector, settings: DatabaseSettings) -> AsyncIterator[AsyncConnection]:
    """An autocommit connection, closed on the way out without a rollback or commit: after an
    outage there is nothing to end, and trying would only log a second error."""
    conn = await AsyncConnection.connect(url, autocommit=True, **connection_options(
        settings, runner_application_name(projector.name), bounded_statements=False, fold=True))
    try:
        # Its appends are read by others at once (the change feed): a crash must not take back a
        # position a client has seen.
        await keep_commits_durable(conn)
        yield conn
    finally:
        await conn.close()


def _renice(increment: int) -> None:
    """Lower the priority of every thread of this process by `increment`. On Linux a niceness
    is a thread's own: os.nice changes the caller's alone, and a thread started before it kept
    competing with the API at full priority (the BLAS worker that numpy starts at import did
    half of every embedding's matrix products at niceness 0)."""
    os.nice(increment)
    niceness = os.getpriority(os.PRIO_PROCESS, 0)  # the calling thread's, on Linux
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:  # no per-thread niceness to mend
        return
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(thread), niceness)
        except OSError:  # the thread ended meanwhile
            continue


async def _sleep_unless_stopped(seconds: float, stop: asyncio.Event) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except asyncio.TimeoutError:
        pass


class Pace:
    """Whether commits arrive fast enough to be worth gathering before a step.

    Gathering trades latency for batch size. A busy journal (at least BUSY_WAKES wake-ups within
    the last second) is folded in batches, one step per `coalesce_seconds`; a quiet one is folded
    at once, so a lone write is searchable without waiting out a gathering meant for a stream."""

    BUSY_WAKES = 8

    def __init__(self) -> None:
        self._wakes: deque[float] = deque(maxlen=self.BUSY_WAKES)

    def busy_after_wake(self, now: float) -> bool:
        self._wakes.append(now)
        return len(self._wakes) == self.BUSY_WAKES and now - self._wakes[0] < 1.0


class IngestBurst:
    """Whether a fold should rest before its next step, leaving the cores to the API while a
    burst of ingests arrives.

    Accepting is the service's promise and folding its debt (a 202 says a write will be
    processed, not when): on two cores a fold at full speed halves the accept rate, and niceness
    alone cannot stop it, since its PostgreSQL backend runs at the server's priority. So while
    ingests (or withdrawals) keep being appended, a fold that is behind rests REST_FACTOR times
    as long as its step took (at most MAX_REST_SECONDS), outside any transaction, so that it holds
    no lock meanwhile; a rest ends early once ingests stop arriving (`_rest`). Every rest is
    bounded by the step before it, so a fold keeps at least a sixth of its speed.

    A fold on the way to searchable rests only for the first `seconds` it is behind, less and less
    over them: under a load it cannot keep up with at a fraction of its speed, it then folds at
    full speed again, and the backlog's 429 (api/backlog.py) stays the bound; once it catches up,
    a new burst counts afresh.
    A fold whose lag is by design (`whole_burst`: embedding) rests after every step of a burst,
    behind or not.

    A burst in which a fold rested a second or more is logged once, at its end:
    `projector_rested` (for how long, and whether it caught up or its time was spent)."""

    REST_FACTOR = 5.0
    MAX_REST_SECONDS = 5.0
    LOGGED_REST_SECONDS = 1.0
    CHANNELS = (f"{NOTIFY_CHANNEL}_ingest", f"{NOTIFY_CHANNEL}_withdrawal")

    def __init__(self, projector: str, seconds: float, whole_burst: bool = False) -> None:
        self.projector = projector
        self.seconds = seconds
        self.whole_burst = whole_burst
        self._arriving = False
        self.arrived = False  # whether ingests arrived during the last step (and the rest before it)
        self._behind_since: float | None = None
        self._rested = 0.0  # in this burst

    @classmethod
    def of(cls, projector: Projector, ingest_burst_seconds: float) -> "IngestBurst":
        """A fold woken by every append rests for `[processes] ingest_burst_seconds` of a burst
        (0: never); a worker, woken by its families alone or by nothing, never does."""
        rests = bool(ingest_burst_seconds) and projector.rests_in_ingest_bursts and projector.wakes_on is None
        return cls(projector.name, ingest_burst_seconds if rests else 0,
                   whole_burst=rests and projector.lags_by_design)

    @property
    def rests(self) -> bool:
        return self.seconds > 0

    def heard(self, channel: str) -> bool:
        """Notes a notification; whether it announced an ingest or a withdrawal."""
        ingest = channel in self.CHANNELS
        self._arriving = self._arriving or ingest
        return ingest

    def rest_after(self, step_seconds: float, more: bool, now: float) -> float:
        """How long to rest (at most) after a step that took `step_seconds` and left `more` to fold."""
        arriving = self.arrived = self._arriving
        self._arriving = False
        if not self.rests:
            return 0.0
        caught_up = not more and not (self.whole_burst and arriving)  # embedding rests anyway
        if caught_up:
            self._behind_since = None
            self._end("caught_up")
            return 0.0
        if self._behind_since is None:
            self._behind_since = now
        spent = 0.0 if self.whole_burst else (now - self._behind_since) / self.seconds
        if spent >= 1.0:
            self._end("burst_time_spent")
            return 0.0
        # Tapering off over the burst time: a fold that then folds at full speed has no cliff to
        # fall from, with a backlog whose appends would hold the journal lock all at once.
        return min(self.MAX_REST_SECONDS, self.REST_FACTOR * (1.0 - spent) * step_seconds) if arriving else 0.0

    def rested(self, seconds: float) -> None:
        self._rested += seconds

    def _end(self, reason: str) -> None:
        if self._rested > 0 and self._rested >= self.LOGGED_REST_SECONDS:
            log.info("projector_rested", projector=self.projector, reason=reason,
                     rested_seconds=round(self._rested, 3))
        self._rested = 0.0


async def _take_notifications(conn: AsyncConnection, burst: IngestBurst) -> bool:
    """The notifications already received (the step that follows reads past all of them);
    whether one of them announced an ingest or a withdrawal."""
    ingest = False
    async for notice in conn.notifies(timeout=0):
        ingest = burst.heard(notice.channel) or ingest
    return ingest


# A rest is taken in slices of this long; one in which no ingest arrived ends it, so that a fold
# resumes within a slice of a burst's end however long the rest it was given.
REST_SLICE_SECONDS = 0.25


async def _rest(conn: AsyncConnection, burst: IngestBurst, seconds: float, stop: asyncio.Event) -> None:
    started = time.monotonic()
    while (left := started + seconds - time.monotonic()) > 0 and not stop.is_set():
        await _sleep_unless_stopped(min(REST_SLICE_SECONDS, left), stop)
        if not await _take_notifications(conn, burst):
            break
    burst.rested(time.monotonic() - started)


async def _wait_for_commit(conn: AsyncConnection, poll_seconds: float, coalesce_seconds: float,
                           pace: Pace, burst: IngestBurst) -> None:
    """Until the next journal commit (or the poll interval); then, when commits come quickly,
    let a few more gather, so that a busy journal is folded in batches rather than one per append."""
    woken = False
    async for notice in conn.notifies(timeout=poll_seconds, stop_after=1):
        burst.heard(notice.channel)
        woken = True
    if woken and pace.busy_after_wake(time.monotonic()):
        await asyncio.sleep(coalesce_seconds)
    await _take_notifications(conn, burst)


async def _end_open_transaction(conn: AsyncConnection, projector: Projector) -> None:
    """Every step ends its transactions (Projector.step). One left open would hold back the
    notifications the wait listens for (PostgreSQL delivers them between transactions) and keep
    its snapshot: it is rolled back, and logged as the defect it is."""
    if not projector.runs_beside_steps and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        log.error("projector_step_left_transaction_open", projector=projector.name,
                  status=conn.info.transaction_status.name)
        await conn.rollback()


def wake_channels(projector: Projector, resting: bool = False) -> list[str]:
    """The journal channels a worker listens to (schema/025): every append, or its families';
    and, for a fold that rests in bursts, the ingests' (IngestBurst)."""
    if projector.wakes_on is None:
        return [NOTIFY_CHANNEL, *(IngestBurst.CHANNELS if resting else ())]
    return [f"{NOTIFY_CHANNEL}_{family}" for family in projector.wakes_on]


async def _take_lock(work: AsyncConnection, projector: Projector, poll_seconds: float, stop: asyncio.Event) -> bool:
    while not stop.is_set():
        cur = await work.execute("SELECT pg_try_advisory_lock(%s)", (instance_lock_id(projector.name),))
        if (await cur.fetchone())[0]:
            return True
        log.info("projector_waiting_for_lock", projector=projector.name)
        await _sleep_unless_stopped(poll_seconds, stop)
    return False


async def run(
    url: str,
    projector: Projector,
    *,
    poll_seconds: float = 1.0,
    coalesce_seconds: float = 0.05,
    retry_first_seconds: float = RETRY_FIRST_SECONDS,
    retry_cap_seconds: float = RETRY_CAP_SECONDS,
    stop: asyncio.Event | None = None,
    settings: DatabaseSettings | None = None,
    process: str | None = None,
    niceness: int = 0,
    ingest_burst_seconds: float = 0.0,
    fault_retry_first_seconds: float = faults.RETRY_FIRST_SECONDS,
    fault_settled_seconds: float = faults.SETTLED_SECONDS,
) -> None:
    """Fold (or work) until `stop`, through database outages and faults; once started, the process is
    reniced by `niceness` (see Projector.niceness_above_background). A fold that rests in
    bursts does so for `ingest_burst_seconds` of each (IngestBurst; 0: never)."""
    stop = stop or asyncio.Event()
    settings = settings or DatabaseSettings()
    outage = OutageLog(process or f"projector:{projector.name}")
    burst = IngestBurst.of(projector, ingest_burst_seconds)
    started = False
    delay = retry_first_seconds
    retrying = faults.Retrying(url, settings, projector, fault_retry_first_seconds, fault_settled_seconds)
    while not stop.is_set():
        try:
            # One connection both listens and works: PostgreSQL delivers a notification to a
            # session between its transactions, and psycopg keeps the ones that arrive during a
            # step for the next wait. Every process of a deployment holds one connection, not two.
            async with _connection(url, projector, settings) as work:
                for channel in wake_channels(projector, burst.rests):
                    await work.execute(f"LISTEN {channel}")
                if projector.single_instance and not await _take_lock(work, projector, poll_seconds, stop):
                    return
                await work.set_autocommit(False)
                try:
                    await projector.open(work)
                    if not started:
                        log.info("projector_started", projector=projector.name)
                        started = True
                        await retrying.restore(work)
                        freeze_start_up_heap()
                        if niceness:
                            _renice(niceness)
                    if outage.back():
                        delay = retry_first_seconds
                    pace = Pace()
                    while not stop.is_set():
                        started_step = time.monotonic()
                        projector.folding, projector.folded_through = (), 0
                        more = await projector.step(work)
                        await _end_open_transaction(work, projector)
                        await retrying.stepped()
                        if more and burst.rests:  # whether ingests arrived during the step
                            await _take_notifications(work, burst)
                        now = time.monotonic()
                        rest = burst.rest_after(now - started_step, more, now)
                        projector.ingests_arriving = burst.arrived
                        if rest:
                            await _rest(work, burst, rest, stop)
                        elif not more:
                            await _wait_for_commit(
                                work, min(poll_seconds, projector.idle_poll_seconds() or poll_seconds),
                                projector.coalesce_seconds or coalesce_seconds, pace, burst)
                    return
                except Exception as exc:
                    if connection_lost(exc):
                        raise
                    if not projector.runs_beside_steps:  # else the open transaction is a run's
                        await work.rollback()  # nothing the failed step began stays locked through the wait
                    # Holding its lock meanwhile (it still runs); then the fold reopens on a new
                    # connection, as after an outage (projectors/faults.py).
                    await _sleep_unless_stopped(await retrying.failed(exc), stop)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not connection_lost(exc):
                raise
            outage.lost(exc)
            await _sleep_unless_stopped(delay, stop)
            delay = min(delay * 2, retry_cap_seconds)
