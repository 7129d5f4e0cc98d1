"""What the service needs of its PostgreSQL server's settings, kept or said at start.

A command's answer says its writes are durable (part 1 rules 1, 3 and 17: committed durably
before the 202). A session whose server or database default is `synchronous_commit = off` would
answer before its commit's WAL reaches the disk, so every connection that writes raises it for
itself (`keep_commits_durable`; the one-shot commands' `storage.database.connect` too). What a
session cannot change (`fsync`, `full_page_writes`: the server's) and what the deployment relies
on the server for (autovacuum) is said at start by the gc worker, with the fix
(`say_what_the_server_lacks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import AsyncConnection

from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.server_settings")

# Only `off` is raised: `local` and the remote levels flush the local WAL too, and an operator's
# choice among them stands.
DURABLE_COMMITS = ("SELECT set_config('synchronous_commit', 'on', false)"
                    " WHERE current_setting('synchronous_commit') = 'off'")

_OFF = "SELECT name FROM pg_settings WHERE name = ANY(%s) AND setting = 'off' ORDER BY name"


async def keep_commits_durable(conn: AsyncConnection) -> None:
    """For an autocommit connection that is about to write: its commits wait for their WAL."""
    await conn.execute(DURABLE_COMMITS)


@dataclass(frozen=True)
class Want:
    """Settings the deployment needs on, and what to say where one is off."""

    event: str
    settings: tuple[str, ...]
    effect: str
    fix: str


DURABILITY = Want(
    "commits_not_durable", ("fsync", "full_page_writes"),
    effect="a crash of the database server's machine can lose or corrupt writes that were answered as accepted (202)",
    fix="turn them on in the PostgreSQL server (ALTER SYSTEM SET fsync = on; ALTER SYSTEM SET full_page_writes = on;"
        " SELECT pg_reload_conf())")
# track_counts: the counts autovacuum acts on. Without autovacuum the service keeps only planner
# statistics and its queue table up: every other table's dead rows stay (`versions` reached three
# times its live size on such a server).
AUTOVACUUM = Want(
    "autovacuum_off", ("autovacuum", "track_counts"),
    effect="dead rows of the read tables are never reclaimed, so they grow with every update; planner statistics"
           " and the queue table are still kept up by the gc worker",
    fix="turn autovacuum on in the PostgreSQL server (ALTER SYSTEM SET autovacuum = on;"
        " ALTER SYSTEM SET track_counts = on; SELECT pg_reload_conf())")


async def what_the_server_lacks(conn: AsyncConnection) -> list[tuple[Want, list[str]]]:
    """Each want the server lacks, with its settings that are off in name order (one read of the
    settings for all of them); `conn` is left outside any transaction."""
    wants = (DURABILITY, AUTOVACUUM)
    async with conn.transaction():
        cur = await conn.execute(_OFF, ([name for want in wants for name in want.settings],))
        off = [name for (name,) in await cur.fetchall()]
    return [(want, named) for want in wants if (named := [name for name in off if name in want.settings])]


async def say_what_the_server_lacks(conn: AsyncConnection) -> None:
    """One warning for each want the server lacks, naming its settings and the fix."""
    for want, named in await what_the_server_lacks(conn):
        log.warning(want.event, settings=named, effect=want.effect, fix=want.fix)
