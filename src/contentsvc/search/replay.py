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

from pathlib import Path

import psycopg
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from contentsvc.journal import events as ev
from contentsvc.journal.store import append, read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.search import generations
from contentsvc.search.lexical_index import LexicalWriter
from projectors.lexical import KIND, apply_to_index, availability_event, still_current

BATCH = 2000


async def _fold(conn, writer: LexicalWriter, start: int, end: int, progress=None, task=None) -> int:
    position = start
    while position < end:
        events = [e for e in await read_after(conn, position, BATCH) if e.position <= end]
        if not events:
            break
        apply_to_index(writer, events)
        position = events[-1].position
        if progress is not None:
            progress.update(task, completed=position)
    return position


async def _accepted_between(conn, start: int, end: int) -> list:
    """The record.accepted and record.withdrawn events in (start, end]."""
    out, position = [], start
    while position < end:
        events = [e for e in await read_after(conn, position, BATCH) if e.position <= end]
        if not events:
            break
        out += [e for e in events if e.kind in (ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN)]
        position = events[-1].position
    return out


async def replay_lexical(url: str, home: Path) -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await generations.serving_or_first(conn, KIND)
        async with conn.transaction():
            new = await generations.create(conn, KIND, "building")
        writer = LexicalWriter(new.path(home))
        head = (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        with Progress(*columns) as progress:
            task = progress.add_task(f"replaying {KIND} into {new.generation_id}", total=max(head, 1))
            position = await _fold(conn, writer, 0, head, progress, task)
            writer.commit(position)
            progress.update(task, completed=max(head, 1))

        await conn.set_autocommit(False)
        async with journal_transaction(conn):
            old = await generations.serving(conn, KIND)
            await conn.execute("SELECT 1 FROM search_generations WHERE generation_id = %s FOR UPDATE",
                               (old.generation_id,))
            # Read only once the row is held, in a statement of its own: a statement that waited
            # for the lock still sees the joined checkpoint as it was before the wait, missing a
            # publication the projector committed meanwhile (it would then be published twice).
            cur = await conn.execute(
                "SELECT g.announced, c.position FROM search_generations g JOIN projector_checkpoints c"
                " ON c.name = %s WHERE g.generation_id = %s",
                (old.checkpoint_name, old.generation_id),
            )
            announced, serving_position = await cur.fetchone()
            target = max(position, serving_position)
            position = await _fold(conn, writer, position, target)
            # The serving generation published availability up to its checkpoint; what the new one
            # holds beyond it (the projector lagged or was down) is published here, with the
            # cutover that makes it visible, or it would never be (the projector resumes at target).
            unpublished = still_current(await _accepted_between(conn, serving_position, target))
            writer.commit(target)
            await conn.execute("UPDATE projector_checkpoints SET position = %s WHERE name = %s",
                               (target, new.checkpoint_name))
            await conn.execute("UPDATE search_generations SET state = 'retired' WHERE generation_id = %s",
                               (old.generation_id,))
            await conn.execute(
                "UPDATE search_generations SET state = 'serving', activated_at = now(), announced = %s"
                " WHERE generation_id = %s", (announced, new.generation_id))
            await append(conn, [availability_event(e, "retrieval_ready", True) for e in unpublished])
            await conn.execute("SELECT pg_notify('contentsvc_projector', %s)", (KIND,))
        writer.close()
        return new.generation_id
