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

from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator

import psycopg
from psycopg import AsyncConnection

from contentsvc.config.settings import DatabaseSettings
from contentsvc.journal.store import UndecodableEvent
from contentsvc.logging import get_logger, safe_message
from contentsvc.projectors.base import Projector
from contentsvc.storage.availability import connection_options
from contentsvc.storage.text import storable

log = get_logger("contentsvc.projector")

RETRY_FIRST_SECONDS = 1.0
RETRY_CAP_SECONDS = 60.0
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


@asynccontextmanager
async def _own_connection(url: str, settings: DatabaseSettings, name: str) -> AsyncIterator[AsyncConnection]:
    """A short connection of its own for the fault's row: the fold's connection may be inside a
    transaction of work beside its steps (a Connector run's page), which this row must not join."""
    async with await AsyncConnection.connect(url, autocommit=True, **connection_options(
            settings, f"contentsvc fault {name}", bounded_statements=True)) as conn:
        yield conn


def retry_delay(attempt: int, first_seconds: float = RETRY_FIRST_SECONDS) -> float:
    """Seconds before the retry that follows failed attempt `attempt` (1, 2, ...): doubling from
    `first_seconds`, at most RETRY_CAP_SECONDS (the exponent bounded too: a fault of days counts
    thousands of attempts, and 2.0 ** 1100 is no float)."""
    return min(first_seconds * 2.0 ** min(attempt - 1, 30), RETRY_CAP_SECONDS)


async def record(url: str, settings: DatabaseSettings, name: str, fault: Fault, attempt: int,
                 exc: Exception, traced: bool) -> None:
    """Logs the fault (its traceback when this process has not yet: `traced` false) and writes
    its row."""
    fields = dict(projector=name, error=fault.error, message=fault.message, position=fault.first_position,
                  through=fault.last_position, kind=fault.kind, attempt=attempt)
    if not traced:
        log.error("projector_faulted", **fields, exc_info=exc)
    else:
        log.warning("projector_fault_persists", **fields)
    async with _own_connection(url, settings, name) as conn:
        await conn.execute(
            "INSERT INTO projector_faults (name, error, message, first_position, last_position, kind)"
            " VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET error = excluded.error, message = excluded.message,"
            " first_position = excluded.first_position, last_position = excluded.last_position,"
            " kind = excluded.kind, attempts = projector_faults.attempts + 1, last_failed_at = now()",
            (name, fault.error, fault.message, fault.first_position, fault.last_position, fault.kind))


async def recorded(conn: AsyncConnection, name: str) -> tuple[Fault | None, int]:
    """The fault recorded for `name` (by an earlier start) and its attempts; (None, 0) when none is."""
    async with conn.transaction():
        cur = await conn.execute("SELECT error, message, first_position, last_position, kind, attempts"
                                 " FROM projector_faults WHERE name = %s", (name,))
        row = await cur.fetchone()
    return (None, 0) if row is None else (Fault(*row[:5]), row[5])


async def clear(url: str, settings: DatabaseSettings, name: str, attempts: int) -> None:
    async with _own_connection(url, settings, name) as conn:
        await conn.execute("DELETE FROM projector_faults WHERE name = %s", (name,))
    log.info("projector_fault_cleared", projector=name, attempts=attempts)


def faults_of(conn: psycopg.Connection, names) -> list[dict]:
    """For the operator's status: the faults of `names`, in their order, JSON-ready."""
    columns = ("name", "error", "message", "first_position", "last_position", "kind", "attempts",
               "first_failed_at", "last_failed_at")
    rows = {r[0]: dict(zip(columns, r)) for r in conn.execute(f"SELECT {', '.join(columns)} FROM projector_faults")}
    return [{**rows[name], "first_failed_at": rows[name]["first_failed_at"].isoformat(),
             "last_failed_at": rows[name]["last_failed_at"].isoformat()} for name in names if name in rows]
