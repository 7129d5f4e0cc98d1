"""A fold's batched lookups are planned for the table as it is now, not as it was when the
fold started (docs/decisions.md, Records and Receipts: "A fold's connection plans every
statement").

A fold's connection lives as long as its process and runs the same statements for ever;
psycopg prepares a statement after five runs, and PostgreSQL then settles on a generic plan
that it keeps until the table is next analyzed. Made while a table is nearly empty, that plan
scans the whole table, and with autovacuum off or behind, the scan grows with every Record.
"""
import asyncio
from contextlib import asynccontextmanager

import psycopg

from contentsvc.config.settings import DatabaseSettings
from contentsvc.projectors import runner
from contentsvc.projectors.materializer import MaterializerProjector
from contentsvc.storage.availability import connection_options

# psycopg prepares a statement at its fifth run; PostgreSQL plans the first five runs of a
# prepared statement for their parameters and may settle on a generic plan from the sixth.
RUNS = 14
# A table of a mid-size where PostgreSQL's default cost of a random page (4, a disk's) made a
# hash join over a sequential scan of the whole table look cheaper than 500 index probes.
IDENTITIES = 40_000
LOOKED_UP = 500


def _fold_connection(url: str):
    """The connection the runner gives a fold."""
    return runner._connection(url, MaterializerProjector, DatabaseSettings())


@asynccontextmanager
async def _ordinary_connection(url: str):
    # PostgreSQL's default cost of a random page, whatever the test server's configuration says.
    options = {**connection_options(DatabaseSettings(), "test", bounded_statements=False),
               "options": "-c random_page_cost=4"}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, **options) as conn:
        yield conn


async def _plans_of_identity_lookups(connection) -> tuple[int, int]:
    """(generic, custom) plans PostgreSQL made for the materializer's identity lookup, run
    RUNS times on an empty table."""
    async with connection as conn:
        keys = {("org", "corpus", "", f"key-{i}") for i in range(50)}
        for _ in range(RUNS):
            assert await MaterializerProjector._load(conn, keys) == {}
        cur = await conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                 " WHERE statement LIKE '%%FROM materializer_identities m%%'")
        rows = await cur.fetchall()
    assert len(rows) == 1, rows  # psycopg prepared the lookup: the premise of this test
    return rows[0]


def test_a_folds_lookups_are_planned_for_the_table_as_it_is_now(databases):
    url = databases.create()
    generic, custom = asyncio.run(_plans_of_identity_lookups(_fold_connection(url)))
    assert generic == 0 and custom > 5, (generic, custom)  # planned past where it would settle
    # The same statement on an ordinary connection settles on a generic plan: what the fold's
    # connections avoid.
    generic, _ = asyncio.run(_plans_of_identity_lookups(_ordinary_connection(url)))
    assert generic > 0


async def _seq_scans(conn) -> int:
    cur = await conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'materializer_identities'")
    return (await cur.fetchone())[0]


async def _lookup_scans_the_whole_table(connection) -> bool:
    """Whether the materializer's lookup of LOOKED_UP of IDENTITIES identities read the table whole."""
    async with connection as conn:
        keys = {("org", "corpus", "", f"key-{i}") for i in range(0, IDENTITIES, IDENTITIES // LOOKED_UP)}
        before = await _seq_scans(conn)
        assert len(await MaterializerProjector._load(conn, keys)) == LOOKED_UP
        await conn.execute("SELECT pg_stat_force_next_flush()")  # this statement's end reports the counts
        return await _seq_scans(conn) > before


def test_a_folds_batched_lookup_probes_the_index_of_a_mid_size_table(databases):
    # docs/decisions.md, Records and Receipts ("costs a random page at 1.1"): the folds' work in
    # PostgreSQL is the largest share of the cores under ingest, and their lookups of a few
    # hundred keys read tables that the cache holds.
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO materializer_identities (org_id, corpus_id, namespace, record_key, record_id,"
                     " withdrawn) SELECT 'org', 'corpus', '', 'key-' || g, 'rec_' || g, false"
                     " FROM generate_series(0, %s) g", (IDENTITIES - 1,))
        conn.execute("ANALYZE materializer_identities")
    assert not asyncio.run(_lookup_scans_the_whole_table(_fold_connection(url)))
    # An ordinary connection, with the server's default costs, reads all 40,000 rows for 500.
    assert asyncio.run(_lookup_scans_the_whole_table(_ordinary_connection(url)))
