"""Which connector kinds a deployment serves, and what each declares (part 2 "Connector kind
description (catalog)"; decisions-part2 "Create, read, list", "Built-in `fixture` kind").

The catalog is the `connector:<kind>` roles of the active plan, each described by its plugin's
manifest, plus the built-in `fixture` kind when `[connectors] fixture_enabled`. `mailbox` is
reserved and any other kind is 422 unsupported_connector_kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.connectors.shapes import webhook_url
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError
from contentsvc.ids import new_id
from contentsvc.plugins import registry
from contentsvc.plugins.manifest import ConnectorKind
from contentsvc.plugins.plans import Provider, load_provider

FIXTURE = "fixture"
ROLE_PREFIX = "connector:"

_ITEM = {"type": "object", "additionalProperties": False, "required": ["record_key", "revision", "text"],
         "properties": {"record_key": {"type": "string", "minLength": 1, "maxLength": 1024},
                        "revision": {"type": "string", "minLength": 1, "maxLength": 256},
                        "text": {"type": "string", "minLength": 1},
                        "title": {"type": "string", "minLength": 1},
                        "withdraw": {"type": "boolean"}}}

# The built-in test kind, described as a plugin manifest would describe it.
FIXTURE_KIND = msgspec.convert({
    "kind": FIXTURE,
    "description": "Built-in test connector: serves the items of its own configuration, in pages.",
    "config_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "title": "Fixture items",
        "type": "object", "additionalProperties": False, "required": ["items"],
        "properties": {
            "items": {"type": "array", "maxItems": 1000, "items": _ITEM},
            "page_size": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
            "error": {"type": "object", "additionalProperties": False, "required": ["error_class", "code"],
                      "properties": {"error_class": {"enum": ["access", "transient", "source"]},
                                     "code": {"type": "string", "minLength": 1, "maxLength": 64}}}}},
    "credential": "optional",
    "credential_schema": {"type": "object", "additionalProperties": False, "required": ["token"],
                          "properties": {"token": {"type": "string", "minLength": 1, "writeOnly": True}}},
    "default_interval_seconds": 300,
    "max_items": 1000,
    "push": {"relay": True, "routes": [
        {"name": "ingest", "path": "ingest", "methods": ["POST"], "auth": "instance_token",
         "request_schema": {"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}}},
        {"name": "ingest_key", "path": "ingest_key", "methods": ["POST", "PUT", "PATCH", "DELETE"], "auth": "service_key",
         "request_schema": {"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}}},
        {"name": "signed", "path": "signed", "methods": ["POST", "GET"], "auth": "signature",
         "signature_header": "x-fixture-signature", "timestamp_header": "x-fixture-timestamp", "window_seconds": 300,
         "request_schema": {"type": "object", "required": ["items"], "properties": {"items": {"type": "array"}}}}]},
}, ConnectorKind)


@dataclass(frozen=True)
class ServedKind:
    description: ConnectorKind
    provider: Provider | None  # None: served by the core (the fixture kind)

    @property
    def kind(self) -> str:
        return self.description.kind

    @property
    def plugin_id(self) -> str | None:
        return None if self.provider is None else self.provider.plugin_id

    def catalog_entry(self) -> dict[str, Any]:
        d = self.description
        title = d.config_schema.get("title") if isinstance(d.config_schema, dict) else None
        entry = {"kind": d.kind, "title": title or d.kind, "description": d.description,
                 "config_schema": d.config_schema, "credential": d.credential,
                 "default_interval_seconds": d.default_interval_seconds}
        if d.credential_schema is not None:
            entry["credential_schema"] = d.credential_schema
        return entry

    def call_body(self, row: dict[str, Any], credential: dict | None, public_base_url: str | None) -> dict[str, Any]:
        """The members every call to the kind's plugin carries (part 2 plugin protocol, connector
        common members, with `connector` as fetch sends it)."""
        connector = {"instance_id": row["connector_id"], "kind": row["kind"], "corpus_id": row["corpus_id"],
                     "source_namespace": row["source_namespace"], "config": row["config"]}
        if public_base_url and self.description.push is not None and self.description.push.relay:
            connector["webhook_url"] = webhook_url(public_base_url, row["connector_id"])
        return {"invocation_id": new_id("inv"), "contribution": "connector", "organization_id": row["org_id"],
                "configuration": self.provider.settings.configuration, "connector": connector,
                "credential": credential, "now": iso(datetime.now(timezone.utc).replace(microsecond=0))}


def served_by(provider: Provider | None, kind: str) -> ServedKind | None:
    """The kind as the provider's manifest declares it; None when it declares no such kind."""
    contribution = provider.manifest.contributions.connector if provider else None
    description = next((k for k in (contribution.kinds if contribution else []) if k.kind == kind), None)
    return None if description is None else ServedKind(description, provider)


# Plans and registrations never change once committed: a plan's kinds are read once per process.
_by_plan: dict[tuple[str | None, bool], dict[str, ServedKind]] = {}


async def served_kinds(conn: AsyncConnection, settings: Settings) -> dict[str, ServedKind]:
    """Every kind new Connectors may use now, by name, sorted."""
    plan_id = await registry.active_plan_id(conn)  # plans are immutable: one read of each
    key = (plan_id, settings.connectors.fixture_enabled)
    if key not in _by_plan:
        _by_plan[key] = await _plan_kinds(conn, settings, await registry.plan(conn, plan_id) if plan_id else None)
    return _by_plan[key]


async def _plan_kinds(conn: AsyncConnection, settings: Settings, plan: registry.Plan | None) -> dict[str, ServedKind]:
    served: dict[str, ServedKind] = {}
    if settings.connectors.fixture_enabled:
        served[FIXTURE] = ServedKind(FIXTURE_KIND, None)
    for role in (plan.roles if plan else []):
        if not role.role.startswith(ROLE_PREFIX):
            continue
        name = role.role.removeprefix(ROLE_PREFIX)
        found = served_by(await load_provider(conn, settings, role.registration_id), name)
        if found is not None:
            served[name] = found
    return dict(sorted(served.items()))


async def served_kind(conn: AsyncConnection, settings: Settings, kind: str) -> ServedKind:
    """The kind, or 422 unsupported_connector_kind (`/kind`)."""
    found = (await served_kinds(conn, settings)).get(kind)
    if found is None:
        raise ApiError(422, "unsupported_connector_kind", f"No connector kind {kind!r} is served here.",
                       field="/kind")
    return found
