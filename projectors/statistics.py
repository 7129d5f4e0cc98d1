"""Planner statistics of this database, kept fresh by the service itself.

PostgreSQL plans from statistics that ANALYZE gathers, and autovacuum runs ANALYZE once a
table has changed by `autovacuum_analyze_threshold` rows plus `autovacuum_analyze_scale_factor`
of its size. Where autovacuum is off, or behind during a bulk load, a table that grew from
nothing keeps the statistics of an empty table: plans that scan it whole, and generic plans
cached on the API's connections that nothing invalidates until the table is next analyzed
(docs/decisions.md, Records and Receipts: "A fold's connection plans every statement").

The gc worker calls `analyze_grown_tables` every STATISTICS_INTERVAL_SECONDS with the same
rule autovacuum applies, read from the server's own settings, for the tables autovacuum leaves
alone (autovacuum or track_counts off, or the table's autovacuum_enabled off), and every
YOUNG_INTERVAL_SECONDS for the young tables alone, whoever analyzes them otherwise. A table
autovacuum analyzes is left to it: a pass every STATISTICS_INTERVAL_SECONDS, twice in each of
autovacuum's default minute (autovacuum_naptime), took every such table before autovacuum did,
twice as often and at full speed, where autovacuum spreads the work with its cost delay.

It also calls `vacuum_queue_tables` every YOUNG_INTERVAL_SECONDS, by autovacuum's vacuum rule,
for the tables whose rows are deleted once their work ends.
"""

from __future__ import annotations

import psycopg
from psycopg import AsyncConnection, sql

from contentsvc.storage.server_settings import AUTOVACUUM

STATISTICS_INTERVAL_SECONDS = 30.0
# Young tables (statistics of fewer than YOUNG_TABLE_ROWS rows, or none yet) are looked at every
# YOUNG_INTERVAL_SECONDS. Theirs are the plans a load makes wrong: on a nearly empty table a
# sequential scan is cheapest, and a generic plan cached on an API connection then scans the
# whole table on every read until the next ANALYZE (a Receipt's read under `bench ingest`: 10-14
# ms at the server instead of a tenth of one, for the first half minute of the load). Their
# ANALYZE is cheap, and once it describes a table of that size the table waits for the full pass.
YOUNG_TABLE_ROWS = 10_000
YOUNG_INTERVAL_SECONDS = 2.0
# ANALYZE waits for a concurrent ANALYZE or VACUUM of the table (autovacuum's, say): not for
# long, the next pass looks again.
_LOCK_WAIT = "SET LOCAL lock_timeout = '1s'"

# Only tables this role may ANALYZE (their owner's or the database owner's rights, which a
# superuser has): on any other, ANALYZE skips with a warning, and the table would be named again
# on every pass. The young pass looks only at tables that grew (rows added, not just changed):
# a small table updated all the time (the projectors' checkpoints) keeps the shape of its plans.
# The full pass looks only at tables autovacuum leaves alone: a setting autovacuum needs is off
# (those the gc worker warns of at start, server_settings.AUTOVACUUM), or the table's own
# autovacuum_enabled reloption is, stored as written (`off`, `false`, `0` all cast to false); under
# CASE, because an AND may cast another option's value first (fillfactor's `70`).
_GROWN = """
SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
JOIN pg_database d ON d.datname = current_database()
CROSS JOIN LATERAL (SELECT current_setting('autovacuum_analyze_threshold')::float8
    + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0) AS changes) rule
WHERE s.schemaname = current_schema()
  AND (pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE'))
  AND s.n_mod_since_analyze > rule.changes
  AND (NOT %(young_only)s
       OR (greatest(c.reltuples, 0) < %(young_rows)s AND s.n_live_tup - greatest(c.reltuples, 0) > rule.changes))
  AND (%(young_only)s
       OR EXISTS (SELECT 1 FROM pg_settings WHERE name = ANY(%(autovacuum_settings)s) AND setting = 'off')
       OR EXISTS (SELECT 1 FROM unnest(c.reloptions) o
                  WHERE CASE WHEN split_part(o, '=', 1) = 'autovacuum_enabled'
                             THEN NOT split_part(o, '=', 2)::bool END))
ORDER BY s.relname
"""


async def analyze_grown_tables(conn: AsyncConnection, young_only: bool = False) -> list[str]:
    """ANALYZE every table of the current schema that autovacuum leaves alone and that changed
    enough since its last ANALYZE (autovacuum's rule), or only the young ones that grew; the
    tables analyzed. `conn` is outside any transaction, and left so."""
    async with conn.transaction():
        grown = await (await conn.execute(_GROWN, {"young_only": young_only, "young_rows": YOUNG_TABLE_ROWS,
                                                   "autovacuum_settings": list(AUTOVACUUM.settings)})).fetchall()
    analyzed = []
    for (table,) in grown:
        try:
            async with conn.transaction():
                await conn.execute(_LOCK_WAIT)
                await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        except psycopg.errors.LockNotAvailable:
            continue
        analyzed.append(table)
    return analyzed


# Tables used as queues: a row is inserted, then deleted once its work ends, so nearly all of
# the table is dead rows until a VACUUM. Where autovacuum is off or behind, the heap and its
# indexes then only grow, every scan walks the dead entries, and the statistics swing between a
# burst's rows and none (docs/decisions.md, "Evaluation and Matches").
QUEUE_TABLES = ("monitor_evaluations",)

_CHURNED = """
SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
JOIN pg_database d ON d.datname = current_database()
WHERE s.schemaname = current_schema() AND s.relname = ANY(%(tables)s)
  AND (pg_has_role(c.relowner, 'USAGE') OR pg_has_role(d.datdba, 'USAGE'))
  AND s.n_dead_tup > current_setting('autovacuum_vacuum_threshold')::float8
      + current_setting('autovacuum_vacuum_scale_factor')::float8 * greatest(c.reltuples, 0)
ORDER BY s.relname
"""


async def vacuum_queue_tables(conn: AsyncConnection) -> list[str]:
    """VACUUM (and ANALYZE) each queue table holding more dead rows than autovacuum's rule
    allows; the tables vacuumed. A table another VACUUM or ANALYZE holds is left to the next
    pass (SKIP_LOCKED). `conn` is outside any transaction, and left so."""
    async with conn.transaction():
        churned = await (await conn.execute(_CHURNED, {"tables": list(QUEUE_TABLES)})).fetchall()
    if not churned:
        return []
    await conn.set_autocommit(True)  # VACUUM runs outside a transaction block
    try:
        for (table,) in churned:
            await conn.execute(sql.SQL("VACUUM (SKIP_LOCKED, ANALYZE) {}").format(sql.Identifier(table)))
    finally:
        await conn.set_autocommit(False)
    return [table for (table,) in churned]
