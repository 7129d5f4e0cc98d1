"""Appending to and reading from the journal.

Ordering: an appending transaction takes one transaction-level advisory
lock just before it draws positions, and holds it until its commit is
visible (PostgreSQL releases locks after the commit is recorded in the
process array). Positions are therefore assigned in commit order: a reader
that has seen position P never later finds a committed event below P, and
`max(position)` read in any snapshot is a safe "everything up to here"
mark. The cost is that appends serialize for the few hundred microseconds
between drawing positions and committing; batches amortize it.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import AsyncIterator, Iterable

import msgspec
from psycopg import AsyncConnection
from psycopg.rows import RowMaker

from contentsvc.storage import database  # noqa: F401  (installs msgspec as the jsonb codec for the read tables)
from contentsvc.journal.codec import decode_payload, fetch_payloads_raw, jsonb_payload
from contentsvc.journal.events import JournalEvent, NewEvent

NOTIFY_CHANNEL = "contentsvc_journal"
# A projector committed a batch (payload: its name); the change feed waits on it.
PROGRESS_CHANNEL = "contentsvc_projector"

_APPEND = """
SELECT journal_append(%b::text[], %b::text[], %b::bool[], %b::text[], %b::text[],
                      %b::text[], %b::text[], %b::text[], %b::text[], %b::jsonb[])
"""

# The lock journal_append takes (schema/004_journal_append_function.sql).
JOURNAL_LOCK = 457136501358


async def hold_journal_lock(conn: AsyncConnection) -> None:
    """Take the journal lock now, until the caller's transaction ends, as an append does: no
    other append commits meanwhile. Every append waits on it, so a writer never holds it across
    a round trip of its own: a decision that must read what others append is made on the server
    under the lock instead (lexical_publish, schema/028). Tests hold it to stand for a writer
    in the middle of its append."""
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (JOURNAL_LOCK,))


_COLUMNS = """position, event_id, kind, public, org_id, corpus_id, subject_type,
              subject_id, version_id, receipt_id, payload, committed_at"""


@asynccontextmanager
async def transaction(conn: AsyncConnection) -> AsyncIterator[None]:
    """A transaction for commands and folds that append to the journal.

    It runs in pipeline mode: statements whose results are read still wait
    for the server, but nothing after the last read (the journal lock, the
    inserts, NOTIFY and COMMIT) waits for a result. So the journal lock is
    never held across a round trip: only while this client sends the
    statements after its append, each in its own write (psycopg flushes
    every statement of a pipeline), which takes microseconds unless its
    process loses its core in between (or is stopped there: SIGSTOP).
    """
    # Not conn.transaction(): in pipeline mode it syncs before COMMIT, which
    # would hold the lock for one more round trip. The rollback happens after
    # the pipeline is left: a statement that failed in it aborts the pipeline,
    # and a rollback sent into an aborted pipeline fails too (PipelineAborted,
    # which would hide the statement's own error).
    # COMMIT is a statement of the pipeline, not conn.commit(): psycopg's
    # commit syncs and then waits for the results without sending what of
    # the pipeline its socket did not take yet, so a transaction of some
    # megabytes (a fold's batch of Versions) could wait forever for a server
    # still waiting for the rest of it. Leaving the pipeline sends all of it
    # before it waits (tests/integration/test_journal_order.py).
    try:
        async with conn.pipeline():
            if conn.autocommit:
                await conn.execute("BEGIN")
            yield
            await conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            await conn.rollback()
        raise


async def append(conn: AsyncConnection, events: Iterable[NewEvent]) -> None:
    """Append events inside the caller's open transaction (see `transaction`).

    Call it as the last write before commit: the journal lock is held from
    here to the end of the transaction.
    """
    events = list(events)
    if events:
        # journal_append (schema/025): takes the journal lock, draws positions, inserts, notifies.
        await conn.execute(_APPEND, columns(events))


def columns(events: list[NewEvent]) -> tuple[list, ...]:
    """`events` as the ten arrays journal_append takes, in its parameters' order."""
    return (
        [e.event_id for e in events],
        [e.kind for e in events],
        [e.public for e in events],
        [e.org_id for e in events],
        [e.corpus_id for e in events],
        [e.subject_type for e in events],
        [e.subject_id for e in events],
        [e.version_id for e in events],
        [e.receipt_id for e in events],
        [jsonb_payload(e.payload) for e in events],
    )


async def read_after(conn: AsyncConnection, position: int, limit: int,
                     kinds: list[str] | None = None, through: int | None = None) -> list[JournalEvent]:
    """Events after a position, in order; only those of `kinds` when given (a replay that
    needs few kinds then decodes no other payload), and none after `through` when given."""
    cur = conn.cursor(row_factory=_journal_event)
    fetch_payloads_raw(cur)
    where, params = ["position > %s"], [position]
    if kinds is not None:
        where.append("kind = ANY(%s)")
        params.append(kinds)
    if through is not None:
        where.append("position <= %s")
        params.append(through)
    await cur.execute(f"SELECT {_COLUMNS} FROM journal WHERE {' AND '.join(where)} ORDER BY position LIMIT %s",
                      (*params, limit))
    return await cur.fetchall()


async def first_position(conn: AsyncConnection, after: int, kinds: list[str], through: int) -> int | None:
    """The first position after `after`, up to `through`, holding an event of `kinds`."""
    cur = await conn.execute("SELECT min(position) FROM journal WHERE position > %s AND position <= %s"
                             " AND kind = ANY(%s)", (after, through, kinds))
    return (await cur.fetchone())[0]


async def read_at(conn: AsyncConnection, positions: list[int]) -> dict[int, JournalEvent]:
    """The events at these positions, by position (work that waits keeps where its command is)."""
    cur = conn.cursor(row_factory=_journal_event)
    fetch_payloads_raw(cur)
    await cur.execute(f"SELECT {_COLUMNS} FROM journal WHERE position = ANY(%s::bigint[])", (positions,))
    return {e.position: e for e in await cur.fetchall()}


class UndecodableEvent(Exception):
    """An event whose payload does not decode as its kind's (written by a newer release, or by
    hand): the reader says which one, since a fold cannot go past it."""

    def __init__(self, position: int, kind: str, reason: str) -> None:
        super().__init__(f"the payload of the {kind} event at position {position} does not decode: {reason}")
        self.position = position
        self.kind = kind


def _journal_event(cursor) -> RowMaker[JournalEvent]:
    def make(row) -> JournalEvent:
        (position, event_id, kind, public, org_id, corpus_id, subject_type, subject_id, version_id, receipt_id,
         payload, committed_at) = row
        try:
            decoded = decode_payload(kind, payload)
        except msgspec.MsgspecError as exc:
            raise UndecodableEvent(position, kind, str(exc)) from exc
        return JournalEvent(position=position, event_id=event_id, kind=kind, public=public, org_id=org_id,
                            corpus_id=corpus_id, subject_type=subject_type, subject_id=subject_id,
                            version_id=version_id, receipt_id=receipt_id, payload=decoded,
                            committed_at=committed_at)
    return make


async def head(conn: AsyncConnection) -> int:
    """The last position. Every position up to it is settled (committed or never to be): an
    append holds the journal lock from taking its positions through its commit."""
    cur = await conn.execute("SELECT coalesce(max(position), 0) FROM journal")
    return (await cur.fetchone())[0]
