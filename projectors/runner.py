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
from contentsvc.projectors.base import Projector
from contentsvc.storage.availability import OutageLog, connection_options, unreachable
from contentsvc.storage.heap import freeze_start_up_heap
from contentsvc.storage.server_settings import keep_commits_durable

log = get_logger("contentsvc.projector")

# Retry delays while the database is away: 0.25 s, doubling, at most this.
RETRY_FIRST_SECONDS = 0.25
RETRY_CAP_SECONDS = 10.0


def _lock_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"projector:{name}".encode()).digest()[:7], "big")


def connection_lost(exc: BaseException) -> bool:
    """The server went away or refused us (shutdown, terminated backend, network): worth
    waiting out. Any other database error is a bug or a conflict, and ends the process."""
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) and unreachable(exc)


@asynccontextmanager
async def _connection(url: str, projector: Projector, settings: DatabaseSettings) -> AsyncIterator[AsyncConnection]:
    """An autocommit connection, closed on the way out without a rollback or commit: after an
    outage there is nothing to end, and trying would only log a second error."""
    conn = await AsyncConnection.connect(url, autocommit=True, **connection_options(
        settings, f"contentsvc projector {projector.name}", bounded_statements=False, fold=True))
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


async def _wait_for_commit(conn: AsyncConnection, poll_seconds: float, coalesce_seconds: float,
                           pace: Pace) -> None:
    """Until the next journal commit (or the poll interval); then, when commits come quickly,
    let a few more gather, so that a busy journal is folded in batches rather than one per append."""
    woken = False
    async for _ in conn.notifies(timeout=poll_seconds, stop_after=1):
        woken = True
    if woken and pace.busy_after_wake(time.monotonic()):
        await asyncio.sleep(coalesce_seconds)
        async for _ in conn.notifies(timeout=0):
            pass


async def _end_open_transaction(conn: AsyncConnection, projector: Projector) -> None:
    """Every step ends its transactions (Projector.step). One left open would hold back the
    notifications the wait listens for (PostgreSQL delivers them between transactions) and keep
    its snapshot: it is rolled back, and logged as the defect it is."""
    if not projector.runs_beside_steps and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        log.error("projector_step_left_transaction_open", projector=projector.name,
                  status=conn.info.transaction_status.name)
        await conn.rollback()


def wake_channels(projector: Projector) -> list[str]:
    """The journal channels a worker listens to (schema/025): every append, or its families'."""
    if projector.wakes_on is None:
        return [NOTIFY_CHANNEL]
    return [f"{NOTIFY_CHANNEL}_{family}" for family in projector.wakes_on]


async def _take_lock(work: AsyncConnection, projector: Projector, poll_seconds: float, stop: asyncio.Event) -> bool:
    while not stop.is_set():
        cur = await work.execute("SELECT pg_try_advisory_lock(%s)", (_lock_id(projector.name),))
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
) -> None:
    """Fold (or work) until `stop`, through database outages; once started, the process is
    reniced by `niceness` (see Projector.niceness_above_background)."""
    stop = stop or asyncio.Event()
    settings = settings or DatabaseSettings()
    outage = OutageLog(process or f"projector:{projector.name}")
    started = False
    delay = retry_first_seconds
    while not stop.is_set():
        try:
            # One connection both listens and works: PostgreSQL delivers a notification to a
            # session between its transactions, and psycopg keeps the ones that arrive during a
            # step for the next wait. Every process of a deployment holds one connection, not two.
            async with _connection(url, projector, settings) as work:
                for channel in wake_channels(projector):
                    await work.execute(f"LISTEN {channel}")
                if projector.single_instance and not await _take_lock(work, projector, poll_seconds, stop):
                    return
                await work.set_autocommit(False)
                await projector.open(work)
                if not started:
                    log.info("projector_started", projector=projector.name)
                    started = True
                    freeze_start_up_heap()
                    if niceness:
                        _renice(niceness)
                if outage.back():
                    delay = retry_first_seconds
                pace = Pace()
                while not stop.is_set():
                    more = await projector.step(work)
                    await _end_open_transaction(work, projector)
                    if not more:
                        await _wait_for_commit(work, min(poll_seconds, projector.idle_poll_seconds() or poll_seconds),
                                               projector.coalesce_seconds or coalesce_seconds, pace)
            return
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            if not connection_lost(exc):
                raise
            outage.lost(exc)
            await _sleep_unless_stopped(delay, stop)
            delay = min(delay * 2, retry_cap_seconds)
