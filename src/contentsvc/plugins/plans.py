"""The active plan as every api and worker process sees it: reloaded from the registry at
`plugin_plan_poll` (part 2: a polling interval, not a completion guarantee).

    plan = ActivePlan(settings)
    await plan.refresh_if_due(conn)                    # before using it, as often as you like
    provider = plan.normalizer_for("application/pdf")  # None: the built-in path
    if provider is not None:
        async with PluginClient(provider.target) as client: ...
        # record plan.plan_id with the work (pinned work keeps the plan it started under)

A provider carries what calling the plugin needs: the registration, its pinned client target
(endpoint, token, identity, manifest digest), its manifest and installed settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.logging import get_logger
from contentsvc.plugins import registry, store
from contentsvc.plugins.client import PluginTarget
from contentsvc.plugins.manifest import InstalledSettings, Manifest, installed_settings, stored_manifest

log = get_logger("contentsvc.plugins.plans")


@dataclass(frozen=True)
class Provider:
    registration_id: str
    plugin_id: str
    version: str
    target: PluginTarget
    manifest: Manifest
    settings: InstalledSettings


@dataclass(frozen=True)
class PlanSnapshot:
    plan_id: str | None
    providers: dict[str, Provider]  # role -> provider

    def normalizer_for(self, media_type: str) -> Provider | None:
        """The normalizer serving `media_type` (parameters and case ignored), or None (the built-in path)."""
        return self.providers.get(f"normalizer:{media_type.split(';')[0].strip().lower()}")


async def load_provider(conn: AsyncConnection, settings: Settings, registration_id: str) -> Provider | None:
    """How to call one registration, whatever plan holds it: pinned work keeps calling the
    registration of the plan it started under, active or not."""
    found = await registry.registration(conn, registration_id)
    if found is None:
        return None
    pinned = stored_manifest(found.manifest)
    return Provider(
        registration_id=registration_id, plugin_id=found.plugin_id, version=found.version,
        target=PluginTarget(found.plugin_id, found.version, found.manifest_digest, found.endpoint,
                            store.read_token(settings, registration_id) if found.has_token else None),
        manifest=pinned.manifest, settings=installed_settings(pinned.manifest, found.settings))


async def load_plan(conn: AsyncConnection, settings: Settings, plan: registry.Plan) -> PlanSnapshot:
    """Every role of a plan with how to call the registration serving it."""
    providers: dict[str, Provider] = {}
    loaded: dict[str, Provider | None] = {}
    for role in plan.roles:
        rid = role.registration_id
        if rid not in loaded:
            loaded[rid] = await load_provider(conn, settings, rid)
        if loaded[rid] is not None:
            providers[role.role] = loaded[rid]
    return PlanSnapshot(plan.plan_id, providers)


class ActivePlan:
    """The active plan, as of the last refresh. Reads never touch the database."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._snapshot = PlanSnapshot(None, {})
        self._due = 0.0  # monotonic time of the next read of the registry: at once

    @property
    def plan_id(self) -> str | None:
        return self._snapshot.plan_id

    def provider(self, role: str) -> Provider | None:
        return self._snapshot.providers.get(role)

    @property
    def snapshot(self) -> PlanSnapshot:
        return self._snapshot

    def normalizer_for(self, media_type: str) -> Provider | None:
        """The normalizer serving `media_type`, or None (the built-in text path)."""
        return self._snapshot.normalizer_for(media_type)

    async def refresh_if_due(self, conn: AsyncConnection) -> None:
        """Reads the registry at most once per `plugin_plan_poll`; cheap to call before every use."""
        if time.monotonic() >= self._due:
            await self.refresh(conn)
            self._due = time.monotonic() + self.settings.plugin_plan_poll

    async def refresh(self, conn: AsyncConnection) -> None:
        plan = await registry.active_plan(conn)
        if plan is None:
            self._snapshot = PlanSnapshot(None, {})
            return
        if plan.plan_id == self._snapshot.plan_id:
            return  # plans are immutable
        self._snapshot = await load_plan(conn, self.settings, plan)
        log.info("plugin_plan_loaded", plan_id=plan.plan_id)
