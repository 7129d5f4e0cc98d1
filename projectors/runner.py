"""The loop every projector runs: read after the checkpoint, fold, commit.

The fold's output and the new checkpoint are written in one PostgreSQL
transaction, so a kill -9 at any instant either loses the whole batch (it
is read again) or keeps all of it: nothing is lost, nothing is applied
twice. One instance per projector holds a session advisory lock; a second
one waits. The loop wakes on LISTEN/NOTIFY and polls as a fallback.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Protocol

from psycopg import AsyncConnection

from contentsvc.journal.events import JournalEvent
from contentsvc.journal.store import NOTIFY_CHANNEL, PROGRESS_CHANNEL, read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger

log = get_logger("contentsvc.projector")


class Projector(Protocol):
    name: str

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        """Fold a batch inside the open transaction (idempotent per event)."""


def _lock_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"projector:{name}".encode()).digest()[:7], "big")


async def ensure_checkpoint(conn: AsyncConnection, name: str) -> None:
    await conn.execute("INSERT INTO projector_checkpoints (name) VALUES (%s) ON CONFLICT DO NOTHING", (name,))


async def checkpoint_of(conn: AsyncConnection, name: str, *, for_update: bool = False) -> int:
    lock = " FOR UPDATE" if for_update else ""
    cur = await conn.execute(f"SELECT position FROM projector_checkpoints WHERE name = %s{lock}", (name,))
    return (await cur.fetchone())[0]


async def step(conn: AsyncConnection, projector: Projector, batch_size: int) -> int:
    """Fold one batch; returns how many events it read.

    Looking costs no write: the checkpoint row is locked (which writes WAL
    and needs a durable commit) only when there is something to fold. The
    lock keeps an operator's replay and this fold from interleaving.
    """
    async with journal_transaction(conn):
        position = await checkpoint_of(conn, projector.name)
        events = await read_after(conn, position, batch_size)
        if events and await checkpoint_of(conn, projector.name, for_update=True) != position:
            return 0  # moved under us (a replay committed): read again from the new checkpoint
        if events:
            await projector.apply(conn, events)
            await conn.execute(
                "UPDATE projector_checkpoints SET position = %s, updated_at = now() WHERE name = %s",
                (events[-1].position, projector.name),
            )
            await conn.execute("SELECT pg_notify(%s, %s)", (PROGRESS_CHANNEL, projector.name))
    return len(events)


async def run(
    url: str,
    projector: Projector,
    *,
    batch_size: int = 1000,
    poll_seconds: float = 1.0,
    coalesce_seconds: float = 0.05,
    stop: asyncio.Event | None = None,
) -> None:
    stop = stop or asyncio.Event()
    async with await AsyncConnection.connect(url, autocommit=True) as listener, \
            await AsyncConnection.connect(url) as work:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        await work.set_autocommit(True)
        while not stop.is_set():
            cur = await work.execute("SELECT pg_try_advisory_lock(%s)", (_lock_id(projector.name),))
            if (await cur.fetchone())[0]:
                break
            log.info("projector_waiting_for_lock", projector=projector.name)
            await asyncio.sleep(poll_seconds)
        await ensure_checkpoint(work, projector.name)
        await work.set_autocommit(False)
        log.info("projector_started", projector=projector.name)
        fold = getattr(projector, "step", None)
        while not stop.is_set():
            # A projector whose output lives outside Postgres runs its own step.
            done = await fold(work, batch_size) if fold else await step(work, projector, batch_size)
            if done == batch_size:
                continue
            # Idle: wait for a commit notification (or poll), then let a few
            # more commits gather so that a busy journal is folded in batches
            # rather than one transaction per append.
            woken = False
            async for _ in listener.notifies(timeout=poll_seconds, stop_after=1):
                woken = True
            if woken:
                await asyncio.sleep(coalesce_seconds)
                async for _ in listener.notifies(timeout=0):
                    pass
