"""`contentsvc projector status` and `replay`: operator views of the folds."""

from __future__ import annotations

import asyncio

import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from contentsvc.journal.store import read_after


def print_status(url: str, names: list[str]) -> int:
    with psycopg.connect(url) as conn:
        head = conn.execute("SELECT coalesce(max(position), 0) FROM journal").fetchone()[0]
        rows = dict(
            (r[0], r[1:])
            for r in conn.execute("SELECT name, position, updated_at FROM projector_checkpoints").fetchall()
        )
        generations = conn.execute(
            "SELECT kind, generation_id, state FROM search_generations WHERE state <> 'retired'"
            " ORDER BY kind, created_at").fetchall()
    table = Table(title=f"journal head {head}")
    for column in ("projector", "generation", "position", "lag (events)", "updated"):
        table.add_column(column)
    for name in names:
        # Index projectors keep one checkpoint per generation.
        gens = [(g, s) for k, g, s in generations if k == name] or [(None, None)]
        for generation, state in gens:
            position, updated = rows.get(f"{name}:{generation}" if generation else name, (0, None))
            table.add_row(name, f"{generation} ({state})" if generation else "-", str(position),
                          str(head - position), updated.isoformat() if updated else "never")
    Console().print(table)
    return 0


READ_TABLES = ("corpora", "receipts", "records", "versions", "uploads", "blobs")


async def _replay_readmodel(url: str, projector) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with conn.transaction():
            # Holding the checkpoint row stops the running projector; readers keep
            # the old rows (DELETE, not TRUNCATE) until this commits.
            await conn.execute("INSERT INTO projector_checkpoints (name) VALUES (%s) ON CONFLICT DO NOTHING",
                               (projector.name,))
            await conn.execute("SELECT 1 FROM projector_checkpoints WHERE name = %s FOR UPDATE", (projector.name,))
            head = (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]
            for table in READ_TABLES:
                await conn.execute(f"DELETE FROM {table}")
            position = 0
            with Progress() as progress:
                task = progress.add_task(f"replaying {projector.name}", total=head)
                while position < head:
                    events = [e for e in await read_after(conn, position, 2000) if e.position <= head]
                    if not events:
                        break
                    await projector.apply(conn, events)
                    position = events[-1].position
                    progress.update(task, completed=position)
            await conn.execute("UPDATE projector_checkpoints SET position = %s, updated_at = now() WHERE name = %s",
                               (position, projector.name))


def replay(url: str, projector) -> int:
    if projector.name == "readmodel":
        asyncio.run(_replay_readmodel(url, projector))
        print("replayed readmodel from position 0")
        return 0
    if projector.name == "lexical":
        from contentsvc.search.replay import replay_lexical

        generation = asyncio.run(replay_lexical(url, projector.home))
        print(f"lexical generation {generation} built from position 0 and now serving")
        return 0
    if projector.name == "vectors":
        from contentsvc.search.replay import replay_vectors

        generation = asyncio.run(replay_vectors(url, projector.home))
        print(f"vector generation {generation} built from the stored vectors and now serving")
        return 0
    print(f"{projector.name} appends facts to the journal; it is never replayed (its output is history).")
    return 2
