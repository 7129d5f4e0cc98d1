"""Reading Connectors and their runs (decisions-part2 "Create, read, list", "Runs"). A Connector
of another Organization, or in a Corpus the key may not read, reads as absent."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.auth.principal import Principal
from contentsvc.config import Settings
from contentsvc.connectors.health import Facts, health_of
from contentsvc.connectors.shapes import Connector, CredentialMetadata, Run, webhook_url
from contentsvc.domain.clock import iso


async def connector_row(conn: AsyncConnection, connector_id: str, lock: bool = False) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT * FROM connectors WHERE connector_id = %s" + (" FOR UPDATE" if lock else ""),
                      (connector_id,))
    return await cur.fetchone()


def visible(p: Principal, row: dict[str, Any] | None) -> bool:
    return row is not None and row["org_id"] == p.org_id and p.covers(row["corpus_id"])


async def visible_connector(conn: AsyncConnection, p: Principal, connector_id: str,
                            lock: bool = False) -> dict[str, Any] | None:
    row = await connector_row(conn, connector_id, lock)
    return row if visible(p, row) else None


def facts(row: dict[str, Any]) -> Facts:
    health = row["health"] or {}
    return Facts(enabled=row["enabled"], created_at=row["created_at"], last_item_at=row["last_item_at"],
                 last_success_at=row["last_success_at"], last_error=health.get("last_error_detail"),
                 credential_expires_at=row["credential_expires_at"],
                 silent_after_seconds=row["health_policy"]["silent_after_seconds"],
                 credential_warning_seconds=row["health_policy"]["credential_warning_seconds"],
                 usage_day=row["usage_day"], items_read_today=row["items_read_today"],
                 items_read_previous_day=row["items_read_previous_day"],
                 diagnostics=health.get("diagnostics") or {}, push=health.get("push"))


def evaluated_health(row: dict[str, Any], now) -> dict[str, Any]:
    """The Health to store after a change: evaluated at `now`, keeping what only the service keeps
    (the failed run's error class, which decides access_error)."""
    kept = {k: v for k, v in (row["health"] or {}).items() if k == "last_error_detail"}
    return {**health_of(facts(row), now), **kept}


def public_health(health: dict[str, Any]) -> dict[str, Any]:
    """The stored Health without what only the service keeps (the failed run's error class)."""
    return {k: v for k, v in health.items() if k != "last_error_detail"}


def connector_view(settings: Settings, row: dict[str, Any], relay: bool) -> Connector:
    view = Connector(
        connector_id=row["connector_id"], corpus_id=row["corpus_id"], source_namespace=row["source_namespace"],
        kind=row["kind"], config=row["config"], schedule={"interval_seconds": row["interval_seconds"]},
        health_policy=row["health_policy"], enabled=row["enabled"], created_at=iso(row["created_at"]),
        health=public_health(row["health"]),
        disabled_at=iso(row["disabled_at"]) if row["disabled_at"] else None,
        next_run_at=iso(row["next_run_at"]) if row["next_run_at"] else None,
        push_policy=row["push_policy"])
    if row["credential"] is not None:
        view.credential = CredentialMetadata(
            version=row["credential_version"], deposited_at=iso(row["credential_deposited_at"]),
            expires_at=iso(row["credential_expires_at"]) if row["credential_expires_at"] else None)
    base = settings.connectors.public_base_url
    if relay and base:
        view.webhook_url = webhook_url(base, row["connector_id"])
    return view


async def list_connectors(conn: AsyncConnection, p: Principal, corpus_id: str | None, kind: str | None,
                          enabled: bool | None, after: str | None, limit: int) -> list[dict[str, Any]]:
    clauses, args = ["org_id = %s"], [p.org_id]
    if p.corpora is not None:
        clauses.append("corpus_id = ANY(%s)")
        args.append(sorted(p.corpora))
    for column, value in (("corpus_id", corpus_id), ("kind", kind), ("enabled", enabled)):
        if value is not None:
            clauses.append(f"{column} = %s")
            args.append(value)
    if after is not None:
        clauses.append("connector_id > %s")
        args.append(after)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT * FROM connectors WHERE {' AND '.join(clauses)} ORDER BY connector_id LIMIT %s",
                      (*args, limit))
    return await cur.fetchall()


def run_view(row: dict[str, Any]) -> Run:
    return Run(run_id=row["run_id"], connector_id=row["connector_id"], trigger=row["trigger"], state=row["state"],
               pages=row["pages"], items_seen=row["items_seen"], receipts_created=row["receipts_created"],
               items_rejected=row["items_rejected"], run_at=iso(row["run_at"]), plan_id=row["plan_id"],
               started_at=iso(row["started_at"]) if row["started_at"] else None,
               finished_at=iso(row["finished_at"]) if row["finished_at"] else None,
               error=row["error"], notice=row["notice"])


async def list_runs(conn: AsyncConnection, connector_id: str, state: str | None, before: str | None,
                    limit: int) -> list[dict[str, Any]]:
    clauses, args = ["connector_id = %s"], [connector_id]
    if state is not None:
        clauses.append("state = %s")
        args.append(state)
    if before is not None:
        clauses.append("run_id < %s")
        args.append(before)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT * FROM connector_runs WHERE {' AND '.join(clauses)} ORDER BY run_id DESC LIMIT %s",
                      (*args, limit))
    return await cur.fetchall()


async def run_row(conn: AsyncConnection, connector_id: str, run_id: str) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT * FROM connector_runs WHERE connector_id = %s AND run_id = %s", (connector_id, run_id))
    return await cur.fetchone()
