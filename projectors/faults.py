"""A step that fails: what the runner records, so that an operator sees what stops a fold.

A step that raises anything but a lost database is a fault: a defect, or an event this release
cannot fold (one written by a newer release, or by hand). A fold cannot go past it: skipping an
event would leave its output wrong for good, and a later release (or a repaired database) folds
it. So the runner (projectors/runner.py) keeps the fold where it is and says so:

- the first failure a process meets is logged `projector_faulted` with its traceback, each later
  one `projector_fault_persists` without it;
- the fault is a row of `projector_faults`, shown by `contentsvc projector status` and `worker
  status`: the error (a database error by its type and SQLSTATE, never the text, which may quote a
  stored value), the events of the failing step (their positions, and their kind when they share
  one), the attempts and since when;
- the runner retries after 1 s, doubling up to a minute, on a new connection; after a step that
  failed on events it reads them one per step until it is past them (and what comes before them
  in full batches: `Projector.batch_bounds`): the events before the one that fails are folded,
  and the row then names that one event;
- the first step that gets past those events (or, for a step that failed on none, the steps of a
  minute that all succeed) deletes the row and logs `projector_fault_cleared`.

The other projectors and workers go on: a fault stops one fold, never the deployment.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import psycopg
from psycopg import AsyncConnection

from contentsvc.config.settings import DatabaseSettings
from contentsvc.journal.store import UndecodableEvent
from contentsvc.logging import get_logger, safe_message
from contentsvc.plugins.client import BACKOFF_CAP_SECONDS, backoff_delay
from contentsvc.projectors.base import Projector
from contentsvc.storage.availability import connection_options
from contentsvc.storage.text import storable

log = get_logger("contentsvc.projector")

RETRY_FIRST_SECONDS = 1.0
RETRY_CAP_SECONDS = BACKOFF_CAP_SECONDS  # a minute
# The unit at which backoff_delay's jitter factor is exactly 1.
NO_JITTER = 0.5
# A fault on no event is over once steps have succeeded this long after it: a step that succeeds
# may not have retried the failing work yet (a worker's call in flight), and clearing at once
# would record the same fault afresh, traceback and shortest backoff included, at every retry.
SETTLED_SECONDS = 60.0
# The stored message is an operator's clue, not a dump: a long one is cut here.
MESSAGE_CHARS = 1000


@dataclass(frozen=True)
class Fault:
    error: str
    message: str
    first_position: int | None = None
    last_position: int | None = None
    kind: str | None = None

    @classmethod
    def of(cls, projector: Projector, exc: Exception) -> "Fault":
        """The fault `exc` is, at the events the projector was folding (or could not decode)."""
        message = storable(safe_message(exc) or repr(exc))[:MESSAGE_CHARS]  # no value a database error quotes
        if isinstance(exc, UndecodableEvent):
            return cls(type(exc).__name__, message, exc.position, exc.position, exc.kind)
        events = projector.folding
        if not events:
            return cls(type(exc).__name__, message)
        kinds = {e.kind for e in events}
        return cls(type(exc).__name__, message, events[0].position, events[-1].position,
                   kinds.pop() if len(kinds) == 1 else None)

    @property
    def at_events(self) -> bool:
        return self.first_position is not None

    def passed(self, folded_through: int, seconds_since: float, settled_seconds: float) -> bool:
        """Whether a step that succeeded, its checkpoint at `folded_through`, `seconds_since` the
        last failure, got past this fault: past its events; or, for a fault on none (a worker's
        own work, retried by a later step, not necessarily this one), steps kept succeeding for
        `settled_seconds`."""
        if self.at_events:
            return folded_through >= self.last_position
        return seconds_since >= settled_seconds

    def where(self) -> str:
        """`position 41 (record.ingested)`, `positions 1-25`, or empty when no event was read."""
        if not self.at_events:
            return ""
        if self.first_position == self.last_position:
            at = f"position {self.first_position}"
        else:
            at = f"positions {self.first_position}-{self.last_position}"
        return f"{at} ({self.kind})" if self.kind else at


def retry_delay(attempt: int, first_seconds: float = RETRY_FIRST_SECONDS) -> float:
    """Seconds before the retry that follows failed attempt `attempt` (1, 2, ...): the plugin
    client's backoff without its jitter (doubling, its exponent bounded: a fault of days counts
    thousands of attempts, and 2.0 ** 1100 is no float), from `first_seconds`, at most
    RETRY_CAP_SECONDS."""
    return min(first_seconds * backoff_delay(attempt, NO_JITTER), RETRY_CAP_SECONDS)


class Retrying:
    """The fault a runner's fold retries, if any, from its first failure until a step gets past it:
    what is logged and written at each failure, how long to wait, when it is over."""

    def __init__(self, url: str, settings: DatabaseSettings, projector: Projector,
                 first_seconds: float = RETRY_FIRST_SECONDS, settled_seconds: float = SETTLED_SECONDS) -> None:
        self.url, self.settings, self.projector = url, settings, projector
        self.first_seconds, self.settled_seconds = first_seconds, settled_seconds
        self.fault: Fault | None = None
        self.attempts = 0
        self.failed_at = time.monotonic()
        self.traced = False  # whether this process logged the fault's traceback yet

    def _set(self, fault: Fault | None, attempts: int) -> None:
        self.fault, self.attempts = fault, attempts
        self.projector.isolating_from = fault.first_position if fault else None  # Projector.batch_bounds

    async def restore(self, conn: AsyncConnection) -> None:
        """At start: a fault recorded before it (a fixed release, or the same fault again) stays
        until a step gets past it. `conn` is outside any transaction, and left so."""
        async with conn.transaction():
            cur = await conn.execute("SELECT error, message, first_position, last_position, kind, attempts"
                                     " FROM projector_faults WHERE name = %s", (self.projector.name,))
            row = await cur.fetchone()
        if row is not None:
            self._set(Fault(*row[:5]), row[5])

    async def failed(self, exc: Exception) -> float:
        """A step failed with `exc`: logs it (its traceback, the first time in this process) and
        writes its row; the seconds to wait before the retry."""
        self._set(Fault.of(self.projector, exc), self.attempts + 1)
        self.failed_at = time.monotonic()
        fault = self.fault
        fields = dict(projector=self.projector.name, error=fault.error, message=fault.message,
                      position=fault.first_position, through=fault.last_position, kind=fault.kind,
                      attempt=self.attempts)
        if not self.traced:
            log.error("projector_faulted", **fields, exc_info=exc)
            self.traced = True
        else:
            log.warning("projector_fault_persists", **fields)
        async with self._own_connection() as conn:
            await conn.execute(
                "INSERT INTO projector_faults (name, error, message, first_position, last_position, kind)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (name) DO UPDATE SET error = excluded.error, message = excluded.message,"
                " first_position = excluded.first_position, last_position = excluded.last_position,"
                " kind = excluded.kind, attempts = projector_faults.attempts + 1, last_failed_at = now()",
                (self.projector.name, fault.error, fault.message, fault.first_position, fault.last_position,
                 fault.kind))
        return retry_delay(self.attempts, self.first_seconds)

    async def stepped(self) -> None:
        """A step succeeded: when it got past the fault, the row goes and the fault is over."""
        if self.fault is None or not self.fault.passed(self.projector.folded_through,
                                                       time.monotonic() - self.failed_at, self.settled_seconds):
            return
        async with self._own_connection() as conn:
            await conn.execute("DELETE FROM projector_faults WHERE name = %s", (self.projector.name,))
        log.info("projector_fault_cleared", projector=self.projector.name, attempts=self.attempts)
        self._set(None, 0)
        self.traced = False

    @asynccontextmanager
    async def _own_connection(self) -> AsyncIterator[AsyncConnection]:
        """A short connection of its own for the fault's row: the fold's connection may be inside a
        transaction of work beside its steps (a Connector run's page), which this row must not join."""
        async with await AsyncConnection.connect(self.url, autocommit=True, **connection_options(
                self.settings, f"contentsvc fault {self.projector.name}", bounded_statements=True)) as conn:
            yield conn


def faults_of(conn: psycopg.Connection, names) -> list[dict]:
    """For the operator's status: the faults of `names`, in their order, JSON-ready."""
    columns = ("name", "error", "message", "first_position", "last_position", "kind", "attempts",
               "first_failed_at", "last_failed_at")
    rows = {r[0]: dict(zip(columns, r)) for r in conn.execute(f"SELECT {', '.join(columns)} FROM projector_faults")}
    return [{**rows[name], "first_failed_at": rows[name]["first_failed_at"].isoformat(),
             "last_failed_at": rows[name]["last_failed_at"].isoformat()} for name in names if name in rows]
