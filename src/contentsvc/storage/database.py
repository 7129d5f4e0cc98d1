"""Where the PostgreSQL server comes from, and connection pools to it.

With CONTENTSVC_DATABASE_URL set, that server is used. Without it, an
embedded PostgreSQL (the pgserver package, a real server) is started under
CONTENTSVC_HOME: same code path, same SQL.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import psycopg
from psycopg_pool import AsyncConnectionPool

from contentsvc.config import Settings
from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.database")

_embedded_handles: list = []


def start_embedded(home: Path) -> str:
    """Start (or join) the embedded PostgreSQL under home/pgdata; returns its URL."""
    warnings.filterwarnings("ignore", module="platformdirs")
    # pgserver's INFO lines are initdb chatter, and its ERROR lines paste the server's own log
    # (which quotes values): our own lines say what failed.
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    from contentsvc.storage import embedded

    server = embedded.start(home)
    if server not in _embedded_handles:
        _embedded_handles.append(server)
    return server.get_uri()


def resolve_database_url(settings: Settings) -> str:
    return settings.database_url or start_embedded(settings.home)


def connect(url: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(url, **kwargs)


def async_pool(url: str, min_size: int = 2, max_size: int = 16) -> AsyncConnectionPool:
    # Autocommit: a plain read needs no transaction (and no ROLLBACK when the
    # connection goes back); commands open theirs explicitly.
    return AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False, timeout=5.0,
                               kwargs={"autocommit": True})



def _use_msgspec_for_json() -> None:
    """jsonb columns are encoded and decoded by msgspec (faster than json)."""
    import msgspec
    from psycopg.types.json import set_json_dumps, set_json_loads

    set_json_dumps(msgspec.json.encode)
    set_json_loads(msgspec.json.decode)


_use_msgspec_for_json()
