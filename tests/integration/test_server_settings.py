"""What the service needs of its PostgreSQL server's settings (storage/server_settings.py), on a
real server: commits that are durable before an answer says so (part 1 rules 1, 3 and 17), and
the settings it cannot change for itself named where they are off (README "Set up and run").
"""
import asyncio

import psycopg
from psycopg import sql

from contentsvc.config.settings import DatabaseSettings
from contentsvc.projectors.base import Projector
from contentsvc.projectors.runner import _connection
from contentsvc.storage.database import BoundedPool, connect
from contentsvc.storage.server_settings import what_the_server_lacks


def _database_with(databases, **defaults: str) -> str:
    """A fresh database whose sessions start with these settings (ALTER DATABASE ... SET)."""
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        name = conn.execute("SELECT current_database()").fetchone()[0]
        for setting, value in defaults.items():
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))
    return url


class _Fold(Projector):
    name = "settings-probe"

    async def step(self, conn) -> bool:
        return False


async def _synchronous_commit_of_service_connections(url: str) -> tuple[str, str]:
    """synchronous_commit as a request's pooled connection and a fold's connection see it."""
    pool = BoundedPool(url, DatabaseSettings(), min_size=1, max_size=1)
    await pool.open(wait=True)
    try:
        async with pool.connection() as conn:
            api = (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]
    finally:
        await pool.close()
    async with _connection(url, _Fold(), DatabaseSettings()) as conn:
        fold = (await (await conn.execute("SHOW synchronous_commit")).fetchone())[0]
    return api, fold


def test_a_database_that_commits_asynchronously_still_commits_durably_for_the_service(databases):
    # part 1 rule 1: committed durably before the 202. A database default of off would answer
    # before the commit's WAL is on disk; the service's sessions raise it to on.
    url = _database_with(databases, synchronous_commit="off")
    with psycopg.connect(url) as conn:  # a session of anyone else keeps the database's default
        assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    assert asyncio.run(_synchronous_commit_of_service_connections(url)) == ("on", "on")
    for autocommit in (True, False):  # a one-shot command's (`keys create` prints what it committed)
        with connect(url, autocommit=autocommit) as conn:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert conn.execute("SHOW synchronous_commit").fetchone()[0] == "on"


def test_an_operators_durable_level_is_kept(databases):
    # `local` flushes the local WAL too: the operator's choice among durable levels stands.
    url = _database_with(databases, synchronous_commit="local")
    assert asyncio.run(_synchronous_commit_of_service_connections(url)) == ("local", "local")


async def _named(url: str) -> dict[str, list[str]]:
    """The warnings the gc worker gives at start, by event, with the settings each names."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        named = {want.event: settings for want, settings in await what_the_server_lacks(conn)}
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # the gc worker VACUUMs next
        return named


def test_settings_that_stop_autovacuum_or_durability_are_named(databases):
    # The gc worker's start-up warnings name each setting that keeps autovacuum from running
    # (the server's own, and track_counts, which a database may set for itself) and each that
    # lets a crash lose commits (the server's alone).
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        server = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                  for name in ("autovacuum", "fsync", "full_page_writes")}
    autovacuum_off = ["autovacuum"] if server["autovacuum"] == "off" else []
    lost = [name for name in ("fsync", "full_page_writes") if server[name] == "off"]

    def warned(autovacuum: list[str]) -> dict[str, list[str]]:
        return {event: named for event, named in (("commits_not_durable", lost), ("autovacuum_off", autovacuum))
                if named}

    assert asyncio.run(_named(url)) == warned(autovacuum_off)
    url = _database_with(databases, track_counts="off")
    assert asyncio.run(_named(url)) == warned(autovacuum_off + ["track_counts"])
