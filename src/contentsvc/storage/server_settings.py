"""What the service needs of its PostgreSQL server's settings, kept or said at start.

A command's answer says its writes are durable (part 1 rules 1, 3 and 17: committed durably
before the 202). A session whose server or database default is `synchronous_commit = off` would
answer before its commit's WAL reaches the disk, so every connection that writes raises it for
itself (`keep_commits_durable`). What a session cannot change (`fsync`, `full_page_writes`:
the server's) and what the deployment relies on the server for (autovacuum) is said once at
start by the gc worker, with the fix (`say_what_the_server_lacks`).
"""

from __future__ import annotations

from psycopg import AsyncConnection

from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.server_settings")

# Only `off` is raised: `local` and the remote levels flush the local WAL too, and an operator's
# choice among them stands.
_DURABLE_COMMITS = ("SELECT set_config('synchronous_commit', 'on', false)"
                    " WHERE current_setting('synchronous_commit') = 'off'")

_OFF = "SELECT name FROM pg_settings WHERE name = ANY(%s) AND setting = 'off' ORDER BY name"


async def keep_commits_durable(conn: AsyncConnection) -> None:
    """For an autocommit connection that is about to write: its commits wait for their WAL."""
    await conn.execute(_DURABLE_COMMITS)


async def _off(conn: AsyncConnection, names: list[str]) -> list[str]:
    async with conn.transaction():
        cur = await conn.execute(_OFF, (names,))
        return [name for (name,) in await cur.fetchall()]


async def autovacuum_stopped_by(conn: AsyncConnection) -> list[str]:
    """The settings, as this connection sees them, that keep autovacuum from running
    (`autovacuum`, or `track_counts`, whose counts it acts on, off); none where it runs. The
    service keeps only planner statistics and its queue table up without it: every other
    table's dead rows stay (`versions` reached three times its live size on such a server)."""
    return await _off(conn, ["autovacuum", "track_counts"])


async def durability_lost_by(conn: AsyncConnection) -> list[str]:
    """The server's settings that let a crash of its machine lose or corrupt committed writes."""
    return await _off(conn, ["fsync", "full_page_writes"])


async def say_what_the_server_lacks(conn: AsyncConnection) -> None:
    """One warning for each want, naming the settings and the fix. `conn` is left outside any
    transaction."""
    if lost_by := await durability_lost_by(conn):
        log.warning("commits_not_durable", settings=lost_by,
                    effect="a crash of the database server's machine can lose or corrupt writes that were"
                           " answered as accepted (202)",
                    fix="turn them on in the PostgreSQL server (ALTER SYSTEM SET fsync = on;"
                        " ALTER SYSTEM SET full_page_writes = on; SELECT pg_reload_conf())")
    if stopped_by := await autovacuum_stopped_by(conn):
        log.warning("autovacuum_off", settings=stopped_by,
                    effect="dead rows of the read tables are never reclaimed, so they grow with every update;"
                           " planner statistics and the queue table are still kept up by the gc worker",
                    fix="turn autovacuum on in the PostgreSQL server (ALTER SYSTEM SET autovacuum = on;"
                        " ALTER SYSTEM SET track_counts = on; SELECT pg_reload_conf())")
