"""The plugin registry's journal events: registrations, their checks and state moves, and plans.

These are internal kinds (decisions-part2, "Change-feed event kinds added": plugin
registrations and plans commit internal events only, with no Corpus). They sit below the
journal so that `journal/events.py` can list them in the one catalogue the codec decodes;
they are plain tagged Structs of the same shape as `EventPayload` (tag field `kind`,
`public` False), and member names never change once written.

A registration's event holds everything but its token and fixture bytes: those stay in
`home/plugins/<registration_id>/` (plugins/store.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

Timestamp = str  # RFC 3339, UTC
JsonObject = dict[str, Any]

PLUGIN_REGISTERED = "plugin.registered"
PLUGIN_CHECKED = "plugin.checked"
PLUGIN_STATE_CHANGED = "plugin.state_changed"
PLUGIN_PLAN_COMMITTED = "plugin.plan_committed"

# Journal rows carry an Organization; the registry is deployment-wide.
DEPLOYMENT_ORG = "_deployment"


class _PluginPayload(msgspec.Struct, kw_only=True, tag_field="kind"):
    public: ClassVar[bool] = False


class PlanRole(msgspec.Struct, kw_only=True):
    role: str
    registration_id: str
    plugin_id: str
    version: str


class PluginRegistered(_PluginPayload, kw_only=True, tag=PLUGIN_REGISTERED):
    """A registration: by the operator (state `registered`, its check queued) or seeded from the
    startup configuration (state `active`)."""

    registration_id: str
    plugin_id: str
    version: str
    endpoint: str
    manifest: str  # the exact manifest text
    manifest_digest: str
    settings: JsonObject  # installed settings with their defaults
    contributions: list[str]
    roles: list[str]
    state: str
    origin: str  # "request" or "configuration"
    created_at: Timestamp
    artifact_digest: str | UnsetType = UNSET
    has_token: bool = False
    fixture_paths: list[str] = msgspec.field(default_factory=list)


class PluginChecked(_PluginPayload, kw_only=True, tag=PLUGIN_CHECKED):
    """A contract check's report; `state` is the move it causes (`validated` or `rejected`), absent
    for a seeded registration, whose check never changes its state."""

    registration_id: str
    check: JsonObject
    checked_at: Timestamp
    state: str | UnsetType = UNSET


class PluginStateChanged(_PluginPayload, kw_only=True, tag=PLUGIN_STATE_CHANGED):
    registration_id: str
    state: str  # active, draining or inactive
    changed_at: Timestamp
    plan_id: str | UnsetType = UNSET  # the plan that moved it, when a plan did


class PluginPlanCommitted(_PluginPayload, kw_only=True, tag=PLUGIN_PLAN_COMMITTED):
    """An immutable Pipeline Plan; it is the active one from its commit until the next."""

    plan_id: str
    source: str  # configuration, activation or rollback
    roles: list[PlanRole]
    created_at: Timestamp
    activated_at: Timestamp
    previous_plan_id: str | UnsetType = UNSET
    # A configuration plan: the role -> registration pins it applied, compared at the next start.
    configuration_pins: dict[str, str] | UnsetType = UNSET
    # A rollback: what happens to work pinned to the registrations it leaves (finish or stop).
    pinned_work: str | UnsetType = UNSET


PLUGIN_PAYLOADS = (PluginRegistered, PluginChecked, PluginStateChanged, PluginPlanCommitted)
