"""The `plugins` worker (decisions-part2 "Contract check"): runs the contract check of each
registration whose check has not run (state `registered`, or seeded `active` by the startup
configuration), and commits `plugin.checked` with the report: `validated` or `rejected` for a
registration in `registered`, no state move for a seeded one. It also commits `draining` ->
`inactive` once nothing is pinned to a draining registration.

Its queue is the read table itself (`check_report IS NULL`), so a restart re-queues what was not
committed; the check runs outside any transaction (it calls the plugin), and its outcome commits
under the registry lock only if no other outcome committed meanwhile.
"""

from __future__ import annotations

import msgspec
import psycopg
from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.domain.clock import utc_now
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.plugins import events as pe
from contentsvc.plugins import registry, store
from contentsvc.plugins.client import PluginTarget
from contentsvc.plugins.contract_check.run import run_contract_check
from contentsvc.plugins.manifest import stored_manifest
from contentsvc.plugins.manifest import installed_settings
from contentsvc.projectors.base import Projector, counted

log = get_logger("contentsvc.plugins.worker")


class PluginsWorker(Projector):
    name = "plugins"
    # Registrations to check, and the end of pinned work a draining registration waits for.
    wakes_on = ("plugin", "connector", "delivery", "operation")

    @staticmethod
    def waiting(conn: psycopg.Connection) -> str:
        waiting = conn.execute("SELECT count(*) FROM plugin_registrations WHERE check_report IS NULL").fetchone()[0]
        return f"{counted(waiting, 'contract check')} waiting"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @classmethod
    def from_settings(cls, settings: Settings) -> "PluginsWorker":
        return cls(settings)

    async def step(self, conn: AsyncConnection) -> bool:
        checked = await self._check_next(conn)
        await self._finish_draining(conn)
        return checked

    async def _check_next(self, conn: AsyncConnection) -> bool:
        queued = await registry.registrations(conn, "check_report IS NULL", (), limit=1)
        await conn.rollback()  # no transaction stays open while the plugin is called
        if not queued:
            return False
        found = queued[0]
        pinned = stored_manifest(found.manifest)
        settings = installed_settings(pinned.manifest, found.settings)
        target = PluginTarget(found.plugin_id, found.version, found.manifest_digest, found.endpoint,
                              store.read_token(self.settings, found.registration_id))
        folder = store.fixtures_folder(self.settings.home, found.registration_id)
        folder.mkdir(parents=True, exist_ok=True)
        report = await run_contract_check(pinned, target, folder, settings)
        async with journal_transaction(conn):
            await registry.lock(conn)
            current = await registry.registration(conn, found.registration_id)
            if current is None or current.check_report is not None:
                return True
            state = ("validated" if report.validated else "rejected") if current.state == "registered" \
                else msgspec.UNSET
            payload = pe.PluginChecked(registration_id=found.registration_id, check=msgspec.to_builtins(report),
                                       checked_at=report.checked_at, state=state)
            await registry.commit(conn, [registry.event(payload, "plugin_registration", found.registration_id)])
        log.info("plugin_checked", registration_id=found.registration_id, plugin_id=found.plugin_id,
                 version=found.version, passed=report.passed, failed=report.failed, skipped=report.skipped,
                 state=None if state is msgspec.UNSET else state)
        return True

    async def _finish_draining(self, conn: AsyncConnection) -> None:
        draining = await registry.registrations(conn, "state = 'draining'")
        await conn.rollback()
        for found in draining:
            if await registry.pinned_work(conn, found.registration_id) > 0:
                continue
            async with journal_transaction(conn):
                await registry.lock(conn)
                current = await registry.registration(conn, found.registration_id)
                active = await registry.active_plan(conn)
                if current is None or current.state != "draining" or (
                        active is not None and found.registration_id in active.role_map.values()):
                    continue
                payload = pe.PluginStateChanged(registration_id=found.registration_id, state="inactive",
                                                changed_at=utc_now())
                await registry.commit(conn, [registry.event(payload, "plugin_registration", found.registration_id)])
            log.info("plugin_drained", registration_id=found.registration_id, plugin_id=found.plugin_id)
