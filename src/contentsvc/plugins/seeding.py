"""Startup seeding (decisions-part2 "Registration request" and "Activation, plans, rollback"):
at `contentsvc run` / `serve` start, each `[plugins.<id>]` pin without a registration of the same
(plugin id, version, manifest digest, installed settings, endpoint) gets one directly in state
`active` (its contract check still runs, reported only), and a `configuration` plan is committed
when the pins differ from the last configuration plan's.

Every process that starts runs it; the registry lock makes it happen once: a second process
finds the registrations and the plan the first committed and commits nothing.
"""

from __future__ import annotations

import shutil

import msgspec
import psycopg

from contentsvc.config import Settings
from contentsvc.config.plugins import PinnedPlugin
from contentsvc.domain.clock import utc_now
from contentsvc.ids import new_id
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.plugins import events as pe
from contentsvc.plugins import registry, store
from contentsvc.plugins.planning import configuration_roles
from contentsvc.plugins.registry import Plan, Registration


def _matches(found: Registration, pin: PinnedPlugin) -> bool:
    return (found.plugin_id, found.version, found.manifest_digest, found.endpoint, found.settings) == (
        pin.plugin_id, pin.pinned.manifest.version, pin.pinned.digest, pin.entry.endpoint,
        msgspec.to_builtins(pin.settings))


def _copy_fixtures(settings: Settings, registration_id: str, pin: PinnedPlugin) -> list[str]:
    """The fixtures next to the pinned manifest (`fixtures/`, as first-party plugins ship them) are
    what its contract check reads."""
    source = pin.entry.manifest.parent / "fixtures"
    target = store.fixtures_folder(settings.home, registration_id)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    return sorted(str(path.relative_to(target)) for path in target.rglob("*") if path.is_file())


async def seed_configuration(conn: psycopg.AsyncConnection, settings: Settings,
                             pinned: dict[str, PinnedPlugin]) -> Plan | None:
    """The configuration plan committed, or None when the pins are those already applied."""
    async with journal_transaction(conn):
        await registry.lock(conn)
        existing = await registry.registrations(conn)
        now = utc_now()
        pins: dict[str, str] = {}
        new_events = []
        for plugin_id, pin in sorted(pinned.items()):
            found = next((r for r in existing if _matches(r, pin)), None)
            if found is None:
                registration_id = new_id("preg")
                if pin.entry.token is not None:
                    store.write_token(settings, registration_id, pin.entry.token)
                manifest = pin.pinned.manifest
                new_events.append(registry.event(pe.PluginRegistered(
                    registration_id=registration_id, plugin_id=plugin_id, version=manifest.version,
                    endpoint=pin.entry.endpoint, manifest=pin.pinned.raw.decode("utf-8"),
                    manifest_digest=pin.pinned.digest, settings=msgspec.to_builtins(pin.settings),
                    contributions=manifest.contributions.names(), roles=pin.roles, state="active",
                    origin="configuration", created_at=now, has_token=pin.entry.token is not None,
                    fixture_paths=_copy_fixtures(settings, registration_id, pin)),
                    "plugin_registration", registration_id))
            else:
                registration_id = found.registration_id
            pins.update({role: registration_id for role in pin.roles})
        last = await registry.last_configuration_plan(conn)
        last_pins = (last.configuration_pins or {}) if last is not None else {}
        if pins == last_pins and not new_events:
            return None
        await registry.commit(conn, new_events)
        by_id = {r.registration_id: r for r in await registry.registrations(conn)}
        active = await registry.active_plan(conn)
        roles = configuration_roles(active.role_map if active else {}, last_pins, pins)
        return await registry.commit_plan(conn, "configuration", roles, active, by_id, now,
                                          configuration_pins=pins)


async def seed_at_start(url: str, settings: Settings, pinned: dict[str, PinnedPlugin]) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        plan = await seed_configuration(conn, settings, pinned)
    if plan is not None:
        registry.log.info("plugin_configuration_applied", plan_id=plan.plan_id,
                          roles=[f"{r.role}={r.plugin_id} {r.version}" for r in plan.roles])
