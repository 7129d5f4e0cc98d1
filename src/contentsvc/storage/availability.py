"""Whether PostgreSQL answers, and how long anything waits for it to.

A frozen server (SIGSTOP, a stalled disk, a hung VM) accepts connections and
bytes but never replies: statement_timeout never fires because the server
never runs its timer, and TCP keepalives are answered by the kernel. So the
bound that matters is the client's own (`answer_within`). A server that is
gone refuses or resets connections, which psycopg reports at once.

Every long-running process notes an outage with one `database_unavailable`
line (naming the process) when it begins and one `database_available` line
when PostgreSQL answers again (`OutageLog`). docs/decisions.md "A slow or
dead database" gives the bounds and their defaults.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg

from contentsvc.config.settings import DatabaseSettings
from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.availability")

# How long psycopg may spend unwinding a cancelled query before it is told to drop the
# connection instead: a frozen server answers the cancel request no sooner than the query.
CANCEL_GRACE_SECONDS = 0.5
# The watch asks this often, and waits this long for the answer.
PROBE_INTERVAL_SECONDS = 1.0
PROBE_ANSWER_SECONDS = 1.0
# Retry delays of a process waiting for the database at start: 0.25 s, doubling, at most this.
RETRY_CAP_SECONDS = 10.0


class StorageUnavailable(Exception):
    """PostgreSQL did not answer within its bound, or is known to be away."""


def connection_options(settings: DatabaseSettings, application_name: str, *,
                       bounded_statements: bool, fold: bool = False) -> dict[str, object]:
    """libpq parameters for a connection of this service.

    Every connection gives up connecting after connect_timeout and sends TCP keepalives
    (a vanished host is noticed within about connect_timeout + 6 s). Only the API's
    connections carry statement and lock timeouts: a projector's fold or a migration may
    legitimately run longer than a request should wait.

    `fold` is for a projector's or worker's connection, which lives as long as its process and
    runs the same batched statements (`= ANY(array)`, joins on `unnest`) for ever. PostgreSQL
    would settle on a generic plan after five runs and keep it until the table is next
    analyzed; a plan made while a table was nearly empty scans it whole, and with autovacuum
    off (or behind) that scan grew with every Record: 90 ms per step at 100,000 Records,
    for a lookup that finds nothing. Planning per statement costs a fraction of a
    millisecond and sees the table's current size. Such a connection also costs a random page
    at 1.1 rather than the default 4 (a disk's seek): a fold's lookup of a few hundred keys
    reads a table the cache holds, where 4 had it read a mid-size table whole (a hash join over
    40,000 identities to find 500) rather than probe its index."""
    options: dict[str, object] = {
        "connect_timeout": settings.connect_timeout_seconds,
        "keepalives": 1,
        "keepalives_idle": settings.connect_timeout_seconds,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "application_name": application_name,
    }
    settings_of_session = []
    if bounded_statements:
        settings_of_session += [f"-c statement_timeout={settings.statement_timeout_ms}",
                                f"-c lock_timeout={settings.lock_timeout_ms}"]
    if fold:
        settings_of_session += ["-c plan_cache_mode=force_custom_plan", "-c random_page_cost=1.1"]
    if settings_of_session:
        options["options"] = " ".join(settings_of_session)
    return options


@asynccontextmanager
async def answer_within(seconds: float, what: str = "the database") -> AsyncIterator[None]:
    """Runs the body for at most `seconds`, then raises StorageUnavailable.

    The first cancellation lets psycopg send the server a cancel request and wait for
    the query to end; if that has not happened after CANCEL_GRACE_SECONDS, a second one
    makes psycopg close the connection (it is in an unknown state; the pool drops it)."""
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    cancels = 0
    handles: list[asyncio.TimerHandle] = []

    def cancel() -> None:
        nonlocal cancels
        cancels += 1
        task.cancel()
        if cancels == 1:
            handles.append(loop.call_later(CANCEL_GRACE_SECONDS, cancel))

    handles.append(loop.call_later(seconds, cancel))
    try:
        yield
    except BaseException as exc:
        if cancels == 0:
            raise
        remaining = 0
        for _ in range(cancels):
            remaining = task.uncancel()
        if remaining > 0:  # someone else cancelled this task too: theirs wins
            raise
        raise StorageUnavailable(f"{what} gave no answer within {seconds:g} s") from exc
    finally:
        for handle in handles:
            handle.cancel()


class OutageLog:
    """One `database_unavailable` line when an outage begins, one `database_available` when it ends."""

    def __init__(self, process: str) -> None:
        self.process = process
        self.since: float | None = None

    @property
    def down(self) -> bool:
        return self.since is not None

    def lost(self, exc: BaseException) -> bool:
        """Notes a failure; True when it begins an outage."""
        if self.since is not None:
            return False
        self.since = time.monotonic()
        log.warning("database_unavailable", process=self.process, error=type(exc).__name__,
                    detail=str(exc).strip().splitlines()[0][:200] if str(exc).strip() else None)
        return True

    def back(self) -> bool:
        """Notes a success; True when it ends an outage."""
        if self.since is None:
            return False
        log.info("database_available", process=self.process, outage_s=round(time.monotonic() - self.since, 1))
        self.since = None
        return True


def unreachable(exc: BaseException) -> bool:
    """The server went away, refused us, or did not answer: worth waiting out. Any other
    database error is a bug or a conflict."""
    if isinstance(exc, (StorageUnavailable, OSError)):
        return True
    if not isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    state = getattr(exc, "sqlstate", None)
    # No SQLSTATE: raised by the client (connection refused, closed, broken or timed out);
    # class 08: connection exception; 57P0x: the server shut down or is starting.
    return state is None or state.startswith(("08", "57P"))


class DatabaseWatch:
    """Asks PostgreSQL every second, on a connection of its own, whether it answers.

    While it does not, the API answers 503 storage_unavailable at once instead of
    letting each request find out by waiting (`available`)."""

    def __init__(self, url: str, settings: DatabaseSettings, process: str, on_back=None) -> None:
        self.url = url
        self.settings = settings
        self.outage = OutageLog(process)
        # Awaited when an outage ends or the watch's connection was dropped: the pool drops its dead ones.
        self.on_back = on_back

    @property
    def available(self) -> bool:
        return not self.outage.down

    async def run(self) -> None:
        conn: psycopg.AsyncConnection | None = None
        options = connection_options(self.settings, f"{self.outage.process} watch", bounded_statements=True)
        asked_again = False
        while True:
            try:
                async with answer_within(self.settings.connect_timeout_seconds + PROBE_ANSWER_SECONDS):
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, **options)
                async with answer_within(PROBE_ANSWER_SECONDS):
                    await conn.execute("SELECT 1")
                # Back from an outage, or from a dropped connection: the pool's may be dead too.
                if (self.outage.back() or asked_again) and self.on_back is not None:
                    await self.on_back()
                asked_again = False
            except asyncio.CancelledError:
                if conn is not None:
                    await conn.close()
                raise
            except Exception as exc:  # noqa: BLE001 - any failure to answer is an outage
                lost = conn is not None and isinstance(exc, psycopg.OperationalError)
                if conn is not None:
                    await conn.close()
                conn = None
                if lost and not asked_again:
                    # The server closed this connection (terminated, restarted, dropped while
                    # idle): no outage until a new connection fails too, asked at once. Taken
                    # for one, a drop found after the server was back refused every request
                    # for a second after it had come back. A probe given no answer (a frozen
                    # server) is one at once: its answer_within raises StorageUnavailable.
                    asked_again = True
                    continue
                asked_again = False
                self.outage.lost(exc)
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)


async def wait_until_answering(url: str, settings: DatabaseSettings, process: str) -> None:
    """Returns once PostgreSQL answers; meanwhile one `database_unavailable` line, and
    retries with backoff (a process started during an outage waits it out)."""
    outage = OutageLog(process)
    delay = 0.25
    options = connection_options(settings, process, bounded_statements=False)
    while True:
        try:
            async with answer_within(settings.connect_timeout_seconds + PROBE_ANSWER_SECONDS):
                conn = await psycopg.AsyncConnection.connect(url, autocommit=True, **options)
            try:
                async with answer_within(PROBE_ANSWER_SECONDS):
                    await conn.execute("SELECT 1")
            finally:
                await conn.close()
            outage.back()
            return
        except Exception as exc:
            if not unreachable(exc):
                raise
            outage.lost(exc)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RETRY_CAP_SECONDS)
