"""Which index generation serves, and where its files live."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from psycopg import AsyncConnection

from contentsvc.ids import new_id
from contentsvc.journal import checkpoints

# The kinds of index generation; each is also the name of the projector that builds it.
LEXICAL = "lexical"
VECTORS = "vectors"


@dataclass(frozen=True)
class Generation:
    generation_id: str
    kind: str
    state: str
    announced: int

    @property
    def checkpoint_name(self) -> str:
        return f"{self.kind}:{self.generation_id}"

    def path(self, home: Path) -> Path:
        return index_path(home, self.kind, self.generation_id)


def index_path(home: Path, kind: str, generation_id: str) -> Path:
    """Where a generation's files live."""
    return home / "indexes" / kind / generation_id


async def serving(conn: AsyncConnection, kind: str) -> Generation | None:
    cur = await conn.execute(
        "SELECT generation_id, kind, state, announced FROM search_generations WHERE kind = %s AND state = 'serving'",
        (kind,),
    )
    row = await cur.fetchone()
    return Generation(*row) if row else None


async def create(conn: AsyncConnection, kind: str, state: str) -> Generation:
    """A new generation; 'serving' only when none serves yet (first start)."""
    generation = Generation(new_id("gen"), kind, state, 0)
    await conn.execute(
        "INSERT INTO search_generations (generation_id, kind, state, activated_at)"
        " VALUES (%s, %s, %s, CASE WHEN %s = 'serving' THEN now() END)",
        (generation.generation_id, kind, state, state),
    )
    await checkpoints.ensure(conn, generation.checkpoint_name)
    return generation


async def hold_if_serving(conn: AsyncConnection, generation: Generation) -> bool:
    """Lock the generation's row for this transaction; False when it no longer serves
    (a replay cut over: the caller drops what it was about to publish)."""
    cur = await conn.execute("SELECT state FROM search_generations WHERE generation_id = %s FOR UPDATE",
                             (generation.generation_id,))
    return (await cur.fetchone())[0] == "serving"


async def lock_serving(conn: AsyncConnection, kind: str) -> tuple[Generation, int, int]:
    """Hold the serving generation's row (the projector waits on it); returns it, its
    `announced` mark and its checkpoint, read only once the row is held (a statement that
    waited for the lock would still see the values from before the wait)."""
    old = await serving(conn, kind)
    await conn.execute("SELECT 1 FROM search_generations WHERE generation_id = %s FOR UPDATE",
                       (old.generation_id,))
    cur = await conn.execute(
        "SELECT g.announced, c.position FROM search_generations g JOIN projector_checkpoints c"
        " ON c.name = %s WHERE g.generation_id = %s", (old.checkpoint_name, old.generation_id))
    announced, position = await cur.fetchone()
    return old, announced, position


async def cut_over(conn: AsyncConnection, old: Generation, new: Generation, position: int, announced: int) -> None:
    """Inside the transaction holding old's row: new serves from `position`, old retires."""
    await checkpoints.reset(conn, new.checkpoint_name, position)
    await conn.execute("UPDATE search_generations SET state = 'retired', retired_at = now() WHERE generation_id = %s",
                       (old.generation_id,))
    await conn.execute("UPDATE search_generations SET state = 'serving', activated_at = now(), announced = %s"
                       " WHERE generation_id = %s", (announced, new.generation_id))


async def serving_or_first(conn: AsyncConnection, kind: str) -> Generation:
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"generation:{kind}",))
        return await serving(conn, kind) or await create(conn, kind, "serving")


async def retired_past_grace(conn: AsyncConnection, grace_seconds: int) -> list[Generation]:
    """Generations out of routing for longer than the grace: their files may go. A searcher
    re-reads the serving generation on every search, so none still reads them by then."""
    cur = await conn.execute(
        "SELECT generation_id, kind, state, announced FROM search_generations WHERE state = 'retired'"
        " AND retired_at < now() - make_interval(secs => %s) ORDER BY kind, created_at", (grace_seconds,))
    return [Generation(*row) for row in await cur.fetchall()]


def bytes_held(directory: Path) -> int:
    """The size of the files under a directory (0 when it is gone, or goes while counted)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                pass
    return total


def delete_files(directory: Path) -> None:
    """Remove a generation's directory; already gone counts as done (a crash mid-way is
    finished by the next collection, which finds the directory again)."""
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
