"""Where the PostgreSQL server comes from, and connection pools to it.

With CONTENTSVC_DATABASE_URL set, that server is used. Without it, an
embedded PostgreSQL (the pgserver package, a real server) is started under
CONTENTSVC_HOME: same code path, same SQL.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from contentsvc.config import Settings
from contentsvc.config.settings import DatabaseSettings
from contentsvc.storage.availability import DatabaseWatch, StorageUnavailable, answer_within, connection_options
from contentsvc.storage.server_settings import DURABLE_COMMITS, keep_commits_durable
from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.database")


def start_embedded(home: Path) -> str:
    """Start (or join) the embedded PostgreSQL under home/pgdata (embedded.start keeps its handle);
    returns its URL."""
    from contentsvc.storage import embedded

    return embedded.start(home).get_uri()


def resolve_database_url(settings: Settings) -> str:
    return settings.database_url or start_embedded(settings.home)


async def database_now(conn: AsyncConnection):
    """The server's clock (the transaction's start): what every row a command writes is stamped with."""
    cur = await conn.execute("SELECT now()")
    return (await cur.fetchone())[0]


def connect(url: str, **kwargs) -> psycopg.Connection:
    """A one-shot command's connection: what it reports done (a key it prints, credentials it
    rewrapped) must outlive a crash of the server (storage/server_settings.py)."""
    conn = psycopg.connect(url, **kwargs)
    try:
        conn.execute(DURABLE_COMMITS)
        if not conn.autocommit:
            conn.commit()  # the session's setting stays; no transaction is left open
    except BaseException:
        conn.close()
        raise
    return conn


class BoundedPool(AsyncConnectionPool):
    """The API's pool: a connection is lent only while the watch sees PostgreSQL answer,
    and a request holding one gets no answer for at most `unresponsive_seconds`
    (docs/decisions.md "A slow or dead database"); past either, StorageUnavailable."""

    def __init__(self, url: str, settings: DatabaseSettings, watch: DatabaseWatch | None = None, *,
                 min_size: int = 2, max_size: int = 16, application_name: str = "contentsvc api") -> None:
        # Autocommit: a plain read needs no transaction (and no ROLLBACK when the
        # connection goes back); commands open theirs explicitly.
        kwargs = {"autocommit": True, **connection_options(settings, application_name, bounded_statements=True)}
        super().__init__(url, min_size=min_size, max_size=max_size, open=False,
                         timeout=float(settings.pool_wait_seconds), kwargs=kwargs, configure=keep_commits_durable)
        self.unresponsive_seconds = float(settings.unresponsive_seconds)
        self.watch = watch
        self.lent = 0  # connections lent through `connection` right now
        # During an outage the pool and psycopg note each failed connect, cancellation and dropped
        # connection; the watch's database_unavailable / database_available lines say it once.
        for name in ("psycopg", "psycopg.pool"):
            logging.getLogger(name).setLevel(logging.ERROR)

    @asynccontextmanager
    async def connection(self, timeout: float | None = None, *,
                         within: float | None = None) -> AsyncIterator[AsyncConnection]:
        if self.watch is not None and not self.watch.available:
            raise StorageUnavailable("the database is not answering")
        async with answer_within(within or self.unresponsive_seconds), AsyncExitStack() as lending:
            try:
                conn = await lending.enter_async_context(super().connection(timeout))
            except PoolTimeout as exc:  # the wait for a connection, not anything the body does
                if self._every_connection_lent():
                    raise PoolBusy(str(exc)) from exc
                raise
            self.lent += 1
            try:
                yield conn
            finally:
                self.lent -= 1

    def _every_connection_lent(self) -> bool:
        """Whether a wait that ran out was for connections other requests hold while the database
        answers (the API is busy), rather than for ones the pool could not open. Counted here,
        not from the pool's size: that counts connections being opened again after an outage too."""
        answering = self.watch is None or self.watch.available
        return answering and self.lent >= self.max_size


class PoolBusy(PoolTimeout):
    """No pooled connection came free in time, every one lent to a request while the database
    answers: the process is busy, the database is not away (429 `server_busy`, not 503)."""


def async_pool(url: str, settings: DatabaseSettings | None = None, watch: DatabaseWatch | None = None,
               min_size: int = 2, max_size: int = 16) -> BoundedPool:
    return BoundedPool(url, settings or DatabaseSettings(), watch, min_size=min_size, max_size=max_size)


def _use_msgspec_for_json() -> None:
    """jsonb columns are encoded and decoded by msgspec (faster than json)."""
    import msgspec
    from psycopg.types.json import set_json_dumps, set_json_loads

    set_json_dumps(msgspec.json.encode)
    set_json_loads(msgspec.json.decode)


_use_msgspec_for_json()
