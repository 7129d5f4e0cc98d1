"""`contentsvc projector replay lexical`: a fresh generation from position 0, then an atomic cutover.

The new generation is built beside the serving one from the journal
(canonical text lives in record.accepted events), never from another
index. Cutover happens in one Postgres transaction that holds the serving
generation's row: the replay folds whatever the serving generation had
already reached, then swaps the two. The lexical projector, blocked on
that row meanwhile, continues on the new generation from the same
position, so no availability event is published twice and searchers see
the old index or the new one, never a gap.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import psycopg
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from contentsvc.journal import events as ev
from contentsvc.journal.store import head as journal_head
from contentsvc.journal.store import read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.overlap import overlapped
from contentsvc.projectors import projections
from contentsvc.projectors.currentness import publish
from contentsvc.projectors.lexical import KIND, apply_to_index
from contentsvc.search import generations
from contentsvc.search.lexical_index import LexicalWriter
from contentsvc.storage.heap import no_cycle_collections

BATCH = 2000
INDEXED_KINDS = [ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN]  # all a lexical generation is made of


async def _fold(conn, writer: LexicalWriter, start: int, end: int, indexed: set[str], progress=None,
                task=None) -> int:
    """Every live projection generation of each Corpus gets each Record's latest Version; a
    generation still being backfilled restarts its backfill in the new index (its cursor
    names the old one), so one that starts during the replay misses nothing.

    The next batch is asked for before this one is indexed: PostgreSQL finds and sends it
    while this process builds documents (SciFact, 15 replays alternating with reading after
    indexing: median 8,240 -> 9,190 Parts/s)."""
    live = await projections.load_live(conn)
    position = start
    events = await _read_batch(conn, position, end) if position < end else []
    while events:
        batch, position = events, events[-1].position
        if position < end and len(batch) == BATCH:
            events = await overlapped(_read_batch(conn, position, end),
                                      lambda: apply_to_index(writer, batch, live, indexed))
        else:
            apply_to_index(writer, batch, live, indexed)
            events = []
        if progress is not None:
            progress.update(task, completed=position)
    return position


def _read_batch(conn, position: int, end: int):
    """The next indexed events after `position`, up to `end` (a coroutine)."""
    return read_after(conn, position, BATCH, INDEXED_KINDS, through=end)


async def _accepted_between(conn, start: int, end: int) -> list:
    """The record.accepted and record.withdrawn events in (start, end]."""
    out, position = [], start
    while position < end:
        events = await _read_batch(conn, position, end)
        if not events:
            break
        out += events
        position = events[-1].position
    return out


async def replay_lexical(url: str, home: Path) -> str:
    with no_cycle_collections():
        return await _replay_lexical(url, home)


async def _replay_lexical(url: str, home: Path) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await generations.serving_or_first(conn, KIND)
        async with conn.transaction():
            new = await generations.create(conn, KIND, "building")
        writer = LexicalWriter(new.path(home), threads=os.cpu_count() or 1)  # a replay may use every core
        head = await journal_head(conn)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns) as progress:
            task = progress.add_task(f"replaying {KIND} into {new.generation_id}", total=max(head, 1))
            indexed: set[str] = set()
            position = await _fold(conn, writer, 0, head, indexed, progress, task)
            writer.commit(position)
            progress.update(task, completed=max(head, 1))

        await conn.set_autocommit(False)
        async with journal_transaction(conn):
            old, announced, serving_position = await generations.lock_serving(conn, KIND)
            target = max(position, serving_position)
            position = await _fold(conn, writer, position, target, indexed)
            # The serving generation published availability up to its checkpoint; what the new one
            # holds beyond it (the projector lagged or was down) is published here, with the
            # cutover that makes it visible, or it would never be (the projector resumes at target).
            unpublished = await _accepted_between(conn, serving_position, target)
            writer.commit(target)
            await publish(conn, unpublished)
            await generations.cut_over(conn, old, new, target, announced)
            # The new index may hold generations that ended during the replay: purge them there too.
            await conn.execute("UPDATE corpus_projections SET purged = false WHERE state IN ('retired', 'failed',"
                               " 'canceled')")
        writer.close()
        return new.generation_id


async def replay_vectors(url: str, home: Path) -> str:
    """A fresh vector generation from the stored vectors (nothing is embedded again), then a cutover.

    The vectors projector writes every vector to Postgres with its checkpoint, so the
    stored vectors of current Versions are exactly what the serving generation reflects.
    """
    from contentsvc.readmodel import vectors as current_vectors
    from contentsvc.search import vector_index
    from contentsvc.search.engine_space import SPACE

    def add(index, rows) -> int:
        if rows:
            vector_index.ensure_capacity(index, len(rows))
            index.add_items(np.stack([vector_index.from_bytes(r[1]) for r in rows]), [r[0] for r in rows])
        return rows[-1][0] if rows else 0

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await generations.serving_or_first(conn, "vectors")
        async with conn.transaction():
            new = await generations.create(conn, "vectors", "building")
        rows = await current_vectors.after_label(conn, SPACE, 0)
        index = vector_index.new_index(len(rows) + 1024)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns) as progress:
            task = progress.add_task(f"replaying vectors into {new.generation_id}", total=max(len(rows), 1))
            for i in range(0, len(rows), BATCH):
                add(index, rows[i:i + BATCH])
                progress.update(task, completed=min(i + BATCH, len(rows)))
        max_label = rows[-1][0] if rows else 0
        await conn.set_autocommit(False)
        async with journal_transaction(conn):
            old, announced, position = await generations.lock_serving(conn, "vectors")
            max_label = max(max_label, add(index, await current_vectors.after_label(conn, SPACE, max_label)))
            vector_index.save(new.path(home), index, position, max_label)
            await generations.cut_over(conn, old, new, position, announced)
        return new.generation_id
