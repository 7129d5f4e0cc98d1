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


def _fold_connection(url: str):
    """The connection the runner gives a fold."""
    return runner._connection(url, MaterializerProjector, DatabaseSettings())


@asynccontextmanager
async def _ordinary_connection(url: str):
    options = connection_options(DatabaseSettings(), "test", bounded_statements=False)
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
