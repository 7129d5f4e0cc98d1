"""Applies the numbered SQL files of schema/ once each, in order.

A session advisory lock makes concurrent starts (api and projectors
starting together) safe: the second waiter finds the work done.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import psycopg

from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.migrations")

MIGRATION_LOCK = 0x6D696772  # "migr"


def schema_dir() -> Path:
    """The migrations shipped inside the package (contentsvc.schema, the checkout's schema/)."""
    return Path(str(resources.files("contentsvc.schema")))


def migrate(url: str) -> list[str]:
    applied: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
            paths = sorted(schema_dir().glob("*.sql"))
            if not paths:  # a broken install must not start a service on an empty schema
                raise RuntimeError(f"no SQL migrations found in {schema_dir()}: the installation is incomplete")
            for path in paths:
                if path.name in done:
                    continue
                with conn.transaction():
                    conn.execute(path.read_text())
                    conn.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (path.name,))
                applied.append(path.name)
                log.info("migration_applied", name=path.name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return applied
