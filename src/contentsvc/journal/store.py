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

from typing import Iterable

from psycopg import AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from contentsvc.journal.events import JournalEvent, NewEvent

JOURNAL_LOCK = 0x6A6F75726E  # "journ"
NOTIFY_CHANNEL = "contentsvc_journal"
# A projector committed a batch (payload: its name); the change feed waits on it.
PROGRESS_CHANNEL = "contentsvc_projector"

_INSERT = """
INSERT INTO journal (position, event_id, kind, public, org_id, corpus_id,
                     subject_type, subject_id, version_id, receipt_id, payload)
SELECT nextval('journal_position_seq'), e.event_id, e.kind, e.public, e.org_id, e.corpus_id,
       e.subject_type, e.subject_id, e.version_id, e.receipt_id, e.payload
FROM unnest(%s::text[], %s::text[], %s::bool[], %s::text[], %s::text[],
            %s::text[], %s::text[], %s::text[], %s::text[], %s::jsonb[])
     WITH ORDINALITY AS e(event_id, kind, public, org_id, corpus_id,
                          subject_type, subject_id, version_id, receipt_id, payload, ord)
ORDER BY e.ord
RETURNING position
"""

_COLUMNS = """position, event_id, kind, public, org_id, corpus_id, subject_type,
              subject_id, version_id, receipt_id, payload, committed_at"""


async def append(conn: AsyncConnection, events: Iterable[NewEvent]) -> list[int]:
    """Append events inside the caller's open transaction; returns their positions.

    Call it as the last write before commit: the journal lock is held from
    here to the end of the transaction.
    """
    events = list(events)
    if not events:
        return []
    columns = (
        [e.event_id for e in events],
        [e.kind for e in events],
        [e.public for e in events],
        [e.org_id for e in events],
        [e.corpus_id for e in events],
        [e.subject_type for e in events],
        [e.subject_id for e in events],
        [e.version_id for e in events],
        [e.receipt_id for e in events],
        [Jsonb(e.payload) for e in events],
    )
    async with conn.pipeline():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (JOURNAL_LOCK,))
        cur = await conn.execute(_INSERT, columns)
        await conn.execute("SELECT pg_notify(%s, '')", (NOTIFY_CHANNEL,))
    return [row[0] for row in await cur.fetchall()]


async def read_after(conn: AsyncConnection, position: int, limit: int) -> list[JournalEvent]:
    cur = conn.cursor(row_factory=class_row(JournalEvent))
    await cur.execute(
        f"SELECT {_COLUMNS} FROM journal WHERE position > %s ORDER BY position LIMIT %s",
        (position, limit),
    )
    return await cur.fetchall()


async def head(conn: AsyncConnection) -> int:
    cur = await conn.execute("SELECT coalesce(max(position), 0) FROM journal")
    return (await cur.fetchone())[0]
