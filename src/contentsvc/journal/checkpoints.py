"""How far each reader of the journal got: the `projector_checkpoints` table.

A checkpoint is a journal position, stored in the transaction that commits
what its reader made of the events up to it. This module is the only one
that writes the table (tests/unit/test_checkpoint_writers.py holds every
other module to that), so the rules live here: a fold only moves its
checkpoint forward; a cutover or a replay sets one outright, under the row
lock that keeps the running fold out meanwhile.

A projector folds under its name; an index projector under one name per
generation (`KIND:GEN`, see search/generations.py).
"""

from __future__ import annotations

from psycopg import AsyncConnection

from contentsvc.journal.store import PROGRESS_CHANNEL


async def ensure(conn: AsyncConnection, name: str) -> None:
    """The checkpoint exists (at position 0 when new)."""
    await conn.execute("INSERT INTO projector_checkpoints (name) VALUES (%s) ON CONFLICT DO NOTHING", (name,))


async def position(conn: AsyncConnection, name: str, *, for_update: bool = False) -> int:
    """The checkpoint's position; `for_update` also holds its row to the end of the transaction
    (a fold and a replay of the same output then never interleave)."""
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(f"SELECT position FROM projector_checkpoints WHERE name = %s{lock}", (name,))
    return (await cur.fetchone())[0]


async def advance(conn: AsyncConnection, name: str, to: int) -> None:
    """Move the checkpoint forward to `to`, never back (a fold re-applied after a crash
    may reach a position its checkpoint already passed)."""
    await conn.execute(
        "UPDATE projector_checkpoints SET position = greatest(position, %s), updated_at = now() WHERE name = %s",
        (to, name))


async def reset(conn: AsyncConnection, name: str, to: int) -> None:
    """Set the checkpoint to exactly `to`: a replay that rebuilt the output, or a cutover that
    hands a new generation the serving one's position. The caller holds the row."""
    await conn.execute("UPDATE projector_checkpoints SET position = %s, updated_at = now() WHERE name = %s",
                       (to, name))


async def announce(conn: AsyncConnection, projector: str) -> None:
    """Tell listeners (the API's change streams) that `projector` committed;
    delivered when the surrounding transaction commits."""
    await conn.execute("SELECT pg_notify(%s, %s)", (PROGRESS_CHANNEL, projector))
