"""The gc worker keeps planner statistics fresh where autovacuum does not (projectors/statistics.py;
docs/decisions.md, Records and Receipts: "A fold's connection plans every statement").

On a real PostgreSQL: this machine's server runs with autovacuum off, as an operator's may.
"""
import asyncio
import uuid

import psycopg
from psycopg import conninfo, sql

from contentsvc.projectors.statistics import YOUNG_TABLE_ROWS, analyze_grown_tables, vacuum_queue_tables
from contentsvc.storage import embedded

GROWN = 5000  # rows: past autovacuum's default rule for an empty table (50 + 10% of 0)
FEW = 20  # below it


_RECEIPTS = ("INSERT INTO receipts (receipt_id, org_id, corpus_id, namespace, record_key, state, diagnostics,"
             " accepted_at) SELECT 'rcp_' || g, 'org', 'c', '', 'k' || g, 'pending', '[]', now()"
             " FROM generate_series(1, %s) g")
_RECORDS = ("INSERT INTO records (record_id, org_id, corpus_id, namespace, record_key, withdrawn, created_at)"
            " SELECT 'rec_' || g, 'org', 'c', '', 'k' || g, false, now() FROM generate_series(1, %s) g")


def _statistics_database(databases) -> str:
    """A fresh database whose two tables autovacuum leaves alone, as this machine's server does
    everywhere: on a server with autovacuum on (the embedded one), it could analyze them
    between a test's changes and its pass."""
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        for table in ("receipts", "records"):
            conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(sql.Identifier(table)))
    return url


def _flushed(conn: psycopg.Connection, statement: str, *params) -> None:
    """`statement`, with the activity counts it made visible to the next transaction."""
    conn.execute(statement, params)
    conn.execute("SELECT pg_stat_force_next_flush()")


def _last_analyzed(conn: psycopg.Connection) -> dict[str, object]:
    return dict(conn.execute("SELECT relname, coalesce(last_analyze, last_autoanalyze) FROM pg_stat_user_tables"
                             " WHERE relname IN ('receipts', 'records')").fetchall())


async def _analyze(url: str, young_only: bool = False) -> list[str]:
    # Not in autocommit mode, as the runner hands a worker its connection.
    async with await psycopg.AsyncConnection.connect(url) as conn:
        analyzed = await analyze_grown_tables(conn, young_only)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # no transaction left open
        return analyzed


def test_tables_that_grew_are_analyzed_and_no_others(databases):
    url = _statistics_database(databases)
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, _RECEIPTS, GROWN)
        _flushed(conn, _RECORDS, FEW)
    assert "receipts" in asyncio.run(_analyze(url))
    with psycopg.connect(url, autocommit=True) as conn:
        last = _last_analyzed(conn)
        assert last["receipts"] is not None
        assert last["records"] is None  # 20 changed rows: not worth an ANALYZE
        reltuples = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'receipts'").fetchone()[0]
        assert reltuples == GROWN  # the planner now knows the table's size
    # Nothing changed since: the next pass analyzes nothing.
    assert asyncio.run(_analyze(url)) == []
    # Nor after a change smaller than a tenth of the table (plus 50 rows), autovacuum's rule.
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, "UPDATE receipts SET state = 'resolved' WHERE receipt_id IN"
                       " (SELECT 'rcp_' || g FROM generate_series(1, %s) g)", GROWN // 10)
    assert asyncio.run(_analyze(url)) == []


def test_a_role_that_may_not_analyze_a_table_leaves_it_alone(databases):
    # A service that runs as a role owning neither the tables nor the database (migrations ran
    # as another): ANALYZE would skip each table with a warning, so none is named as analyzed.
    url = _statistics_database(databases)
    role = f"cs_stats_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, _RECEIPTS, GROWN)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        as_role = conninfo.make_conninfo(url, user=role)
        assert asyncio.run(_analyze(as_role)) == []
        assert "receipts" in asyncio.run(_analyze(url))  # the owner's pass does
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_young_pass_analyzes_only_small_tables_that_grew(databases):
    url = _statistics_database(databases)
    with psycopg.connect(url, autocommit=True) as conn:
        # A small table changed all the time without growing (as the projectors' checkpoints are).
        _flushed(conn, _RECORDS, FEW)
        for _ in range(5):
            _flushed(conn, "UPDATE records SET withdrawn = NOT withdrawn")
        _flushed(conn, _RECEIPTS, GROWN)  # a table that grew from nothing
    assert asyncio.run(_analyze(url, young_only=True)) == ["receipts"]
    assert "records" in asyncio.run(_analyze(url))  # changed by autovacuum's rule: the full pass takes it
    # A table whose statistics describe YOUNG_TABLE_ROWS rows is left to the full pass, however it grows.
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, _RECEIPTS.replace("'rcp_' || g", "'rcp_big_' || g"), YOUNG_TABLE_ROWS)
    assert asyncio.run(_analyze(url, young_only=True)) == ["receipts"]  # statistics of 5,000 rows: young
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, _RECEIPTS.replace("'rcp_' || g", "'rcp_more_' || g"), YOUNG_TABLE_ROWS)
    assert asyncio.run(_analyze(url, young_only=True)) == []
    assert asyncio.run(_analyze(url)) == ["receipts"]


def test_a_plan_cached_on_an_empty_table_is_made_again_after_the_young_pass(databases):
    # What the young pass is for: an API connection's generic plan, made while the table was
    # empty, scans it whole on every read until an ANALYZE invalidates it.
    url = _statistics_database(databases)
    with psycopg.connect(url, autocommit=True) as api:
        api.execute("SET plan_cache_mode = force_generic_plan")  # as chosen after a statement's fifth run
        api.execute("PREPARE receipt_read(text[]) AS SELECT state FROM receipts WHERE receipt_id = ANY($1)")

        def plan() -> str:
            return "\n".join(row[0] for row in api.execute("EXPLAIN EXECUTE receipt_read('{rcp_7}')"))

        assert "Seq Scan on receipts" in plan()
        _flushed(api, _RECEIPTS, GROWN)
        assert "Seq Scan on receipts" in plan()  # grown, and still planned for the empty table
        assert asyncio.run(_analyze(url, young_only=True)) == ["receipts"]
        assert "Index" in plan() and "Seq Scan" not in plan()


_EVALUATIONS = ("INSERT INTO monitor_evaluations (subscription_version_id, version_id, subscription_id, org_id,"
                " corpus_id, record_id, trigger_position, next_attempt_at)"
                " SELECT 'subv_1', 'ver_' || g, 'sub_1', 'org', 'c', 'rec_' || g, g, now() FROM generate_series(1, %s) g")


async def _vacuum(url: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(url) as conn:  # not in autocommit mode, as the runner's
        vacuumed = await vacuum_queue_tables(conn)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and not conn.autocommit
        return vacuumed


def test_a_queue_table_of_dead_rows_is_vacuumed_and_one_without_is_left(databases):
    # docs/decisions.md "Evaluation and Matches": monitor_evaluations is a queue (a row is deleted
    # once its evaluation ends); where autovacuum does not run, the gc worker vacuums it
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE monitor_evaluations SET (autovacuum_enabled = false)")
        _flushed(conn, _EVALUATIONS, FEW)
        _flushed(conn, "DELETE FROM monitor_evaluations")
    assert asyncio.run(_vacuum(url)) == []  # 20 dead rows: within autovacuum's rule (50 + 20% of 0)
    with psycopg.connect(url, autocommit=True) as conn:
        _flushed(conn, _EVALUATIONS.replace("'ver_' || g", "'ver_' || (g + 100)"), GROWN)
        _flushed(conn, "DELETE FROM monitor_evaluations")
        dead_before = conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables"
                                   " WHERE relname = 'monitor_evaluations'").fetchone()[0]
    assert dead_before >= GROWN
    assert asyncio.run(_vacuum(url)) == ["monitor_evaluations"]
    with psycopg.connect(url, autocommit=True) as conn:
        vacuumed_at, dead = conn.execute("SELECT last_vacuum, n_dead_tup FROM pg_stat_user_tables"
                                         " WHERE relname = 'monitor_evaluations'").fetchone()
    assert vacuumed_at is not None and dead == 0


def test_the_full_pass_leaves_to_autovacuum_the_tables_it_analyzes(tmp_path):
    # With autovacuum on (PostgreSQL's default; the embedded server here), autovacuum analyzes a
    # grown table at its own pace, spread by its cost delay: a full pass of its own, every
    # STATISTICS_INTERVAL_SECONDS, would analyze the same tables again and first (under `bench
    # ingest`, 1.1 s of the server's CPU within a 4 s phase). It takes those autovacuum leaves
    # alone; the young pass still takes a young table that grew, whoever analyzes it later.
    server = embedded.start(tmp_path / "home")
    try:
        url = server.get_uri()
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SHOW autovacuum").fetchone()[0] == "on"
            # autovacuum stays on, but does not get round to these tables during the test
            conn.execute("ALTER SYSTEM SET autovacuum_naptime = '1d'")
            conn.execute("SELECT pg_reload_conf()")
            # with another option, as the read tables have (schema/030): only autovacuum_enabled is read
            conn.execute("CREATE TABLE analyzed_by_autovacuum (n int) WITH (fillfactor = 70)")
            conn.execute("CREATE TABLE left_alone_by_autovacuum (n int) WITH (autovacuum_enabled = off)")
            for table in ("analyzed_by_autovacuum", "left_alone_by_autovacuum"):
                _flushed(conn, f"INSERT INTO {table} SELECT generate_series(1, {GROWN})")
        assert asyncio.run(_analyze(url)) == ["left_alone_by_autovacuum"]
        assert asyncio.run(_analyze(url, young_only=True)) == ["analyzed_by_autovacuum"]
    finally:
        embedded.stop(server)
