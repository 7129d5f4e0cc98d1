"""Startup seeding (decisions-part2 "Registration request", "Activation, plans, rollback"): a
`[plugins.pdf]` pin becomes an active registration and a `configuration` plan at start; a restart
with the same pins commits nothing new."""

from __future__ import annotations

import asyncio
import shutil
import time

import httpx
import psycopg

from contentsvc.config import Settings
from contentsvc.plugins.plans import ActivePlan

from tests.conftest import ServerProcess
from tests.e2e.test_plugin_admin import PDF, operator_key
from tests.integration.plugin_processes import PluginProcess


async def _active_plan(url: str, home) -> ActivePlan:
    cached = ActivePlan(Settings(home=home))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await cached.refresh(conn)
    return cached


def test_a_pinned_plugin_is_seeded_active_with_a_configuration_plan(databases, tmp_path):
    plugin = PluginProcess("pdf", tmp_path)
    deploy = tmp_path / "deploy"
    (deploy / "pdf").mkdir(parents=True)
    shutil.copy(PDF / "contentsvc-plugin.json", deploy / "pdf")
    shutil.copytree(PDF / "fixtures", deploy / "pdf" / "fixtures")
    config = deploy / "contentsvc.toml"
    config.write_text(f'[plugins.pdf]\nendpoint = "{plugin.base_url}"\nversion = "0.1.0"\n'
                      'manifest = "pdf/contentsvc-plugin.json"\n')
    url = databases.create()
    home = tmp_path / "home"
    server = ServerProcess(url, tmp_path, {"CONTENTSVC_CONFIG": str(config)}, home=home)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30,
                          headers={"Authorization": f"Bearer {operator_key(url)}"}) as admin:
            plan = admin.get("/v0/admin/plugins/plan")
            assert plan.status_code == 200, plan.text
            plan = plan.json()
            assert plan["source"] == "configuration" and "previous_plan_id" not in plan
            [role] = plan["roles"]
            assert role["role"] == "normalizer:application/pdf" and role["plugin_id"] == "pdf"
            [registration] = admin.get("/v0/admin/plugins").json()["items"]
            assert registration["state"] == "active" and registration["registration_id"] == role["registration_id"]
            # its contract check still runs and is reported, never changing its state
            deadline = time.monotonic() + 60
            detail = {}
            while time.monotonic() < deadline and "check" not in detail:
                detail = admin.get(f"/v0/admin/plugins/{registration['registration_id']}").json()
                time.sleep(0.2)
            assert detail["check"]["failed"] == 0 and detail["state"] == "active"
        # the plan cache every process polls names the normalizer and how to call it
        cached = asyncio.run(_active_plan(url, home))
        provider = cached.normalizer_for("application/pdf")
        assert cached.plan_id == plan["plan_id"] and cached.normalizer_for("text/html") is None
        assert provider.target.endpoint == plugin.base_url and provider.manifest.id == "pdf"
        assert provider.target.manifest_digest == registration["manifest_digest"]
        server.stop()
        # the same pins at the next start: no new registration, no new plan
        server = ServerProcess(url, tmp_path, {"CONTENTSVC_CONFIG": str(config)}, home=home)
        with httpx.Client(base_url=server.base_url, timeout=30,
                          headers={"Authorization": f"Bearer {operator_key(url)}"}) as admin:
            assert [p["plan_id"] for p in admin.get("/v0/admin/plugins/plans").json()["items"]] == [plan["plan_id"]]
            assert len(admin.get("/v0/admin/plugins").json()["items"]) == 1
    finally:
        server.stop()
        plugin.stop()
