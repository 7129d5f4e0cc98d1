"""The API's database watch (docs/decisions.md "A slow or dead database") against a real server:
a connection the server drops is no outage while a new one answers, so requests are never
refused for a database that is up; a database that refuses new connections is one."""

from __future__ import annotations

import asyncio
import time

import psycopg

from contentsvc.config.settings import DatabaseSettings
from contentsvc.storage.availability import PROBE_INTERVAL_SECONDS, DatabaseWatch
from tests.conftest import until_async


def drop_watch_connection(admin_url: str, dbname: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        return admin.execute("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                             " WHERE datname = %s AND application_name = 'api watch') t", (dbname,)).fetchone()[0]


def test_a_dropped_connection_is_no_outage_and_the_pool_is_checked(databases, admin_url):
    url = databases.create()
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]

    async def scenario():
        checks = []

        async def on_back():
            checks.append(time.monotonic())

        watch = DatabaseWatch(url, DatabaseSettings(), "api", on_back=on_back)
        task = asyncio.create_task(watch.run())
        try:
            await asyncio.sleep(0.5)
            assert watch.available
            assert await asyncio.to_thread(drop_watch_connection, admin_url, dbname) == 1
            seen_down = False
            deadline = time.monotonic() + 3 * PROBE_INTERVAL_SECONDS
            while time.monotonic() < deadline:  # past the next probes, which find the connection gone
                seen_down |= not watch.available
                await asyncio.sleep(0.01)
            assert not seen_down
            assert checks, "the pool was not told to check its connections, which the server may have dropped too"

            # A database refusing new connections is an outage, found within a probe or two.
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
            try:
                await asyncio.to_thread(drop_watch_connection, admin_url, dbname)
                await until_async(lambda: not watch.available, "the refused connections are taken for an outage",
                                  timeout=5 * PROBE_INTERVAL_SECONDS, every=0.01)
            finally:
                with psycopg.connect(admin_url, autocommit=True) as admin:
                    admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            await until_async(lambda: watch.available, "the watch sees the database back",
                              timeout=5 * PROBE_INTERVAL_SECONDS, every=0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    asyncio.run(scenario())
