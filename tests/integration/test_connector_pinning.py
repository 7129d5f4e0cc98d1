"""A connector run is pinned work (part 2 "Plugin registration and plan": unfinished work keeps the
plan it started under; decisions-part2 "Runs": `pinned_plan_stopped`): a rollback with
`pinned_work: stop` that leaves out the run's registration stops it at its next page, and a run
under way on a plan no longer active counts in the registration's `pinned_work`. Real PostgreSQL,
plans written as the registry writes them."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import psycopg
from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.connectors.kinds import FIXTURE_KIND, ServedKind
from contentsvc.connectors.worker import ConnectorsWorker
from contentsvc.plugins import registry

T0 = datetime(2026, 3, 1, tzinfo=timezone.utc)


def plan(conn, plan_id: str, registrations: list[str], minutes: int, pinned_work: str | None = None) -> None:
    roles = [{"role": "connector:rss", "registration_id": r, "plugin_id": "rss", "version": "0.1.0"}
             for r in registrations]
    at = T0 + timedelta(minutes=minutes)
    conn.execute("INSERT INTO plugin_plans (plan_id, source, roles, pinned_work, created_at, activated_at)"
                 " VALUES (%s, 'activation', %s, %s, %s, %s)", (plan_id, json.dumps(roles), pinned_work, at, at))


def test_a_stop_rollback_without_the_registration_stops_the_run_and_runs_count_as_pinned_work(databases):
    url = databases.create()
    with psycopg.connect(url) as conn:
        plan(conn, "plan_a", ["preg_1"], 0)
        plan(conn, "plan_b", ["preg_1", "preg_2"], 1, pinned_work="stop")  # keeps preg_1: no stop for it
        conn.execute("INSERT INTO connectors (connector_id, org_id, corpus_id, source_namespace, kind, config,"
                     " interval_seconds, health_policy, created_at, health) VALUES"
                     " ('con_1', 'org', 'c', 'ns', 'rss', '{}', 300, '{}', now(), '{}')")
        conn.execute("INSERT INTO connector_runs (run_id, connector_id, org_id, corpus_id, trigger, state, run_at,"
                     " plan_id) VALUES ('run_1', 'con_1', 'org', 'c', 'schedule', 'running', now(), 'plan_a')")
    worker = ConnectorsWorker(Settings(database_url=url))
    served = ServedKind(FIXTURE_KIND, SimpleNamespace(registration_id="preg_1"))
    run = {"run_id": "run_1", "plan_id": "plan_a"}

    async def check() -> tuple[bool, int]:
        async with await AsyncConnection.connect(url) as conn:
            return await worker._stopped(conn, run, served), await registry.pinned_work(conn, "preg_1")

    assert asyncio.run(check()) == (False, 1)  # plan_b is active; the run started on plan_a
    with psycopg.connect(url) as conn:
        plan(conn, "plan_c", ["preg_2"], 2, pinned_work="stop")  # leaves preg_1 out
    assert asyncio.run(check()) == (True, 1)
    with psycopg.connect(url) as conn:
        conn.execute("UPDATE connector_runs SET state = 'failed'")
    assert asyncio.run(check())[1] == 0
