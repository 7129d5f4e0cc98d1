"""The plugin registry's read side and its one way of writing: `commit` folds plugin events into
`plugin_registrations` and `plugin_plans` and appends them, in the caller's transaction.

Every writer (the admin commands, startup seeding, the `plugins` worker) first takes
`lock(conn)`, one transaction-level advisory lock for the whole registry, so registry
decisions (which plan is active, which state a registration is in) are made on what the
previous writer committed, and inline folding in commit order leaves the same rows a replay of
the journal would. Plugin events are folded here only: nothing else appends them.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from contentsvc.domain.clock import iso
from contentsvc.ids import new_id
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.logging import get_logger
from contentsvc.plugins import events as pe
from contentsvc.plugins.manifest import stored_manifest
from contentsvc.plugins.planning import Candidate, candidate_of
from contentsvc.plugins.shapes import (
    CheckObject,
    PipelinePlan,
    PlanRoleView,
    PluginRegistration,
    PluginRegistrationDetail,
)

log = get_logger("contentsvc.plugins")

REGISTRY_LOCK = 457136501371  # pg_advisory_xact_lock key of every registry writer


async def lock(conn: AsyncConnection) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(%s)", (REGISTRY_LOCK,))


def event(payload, subject_type: str, subject_id: str) -> NewEvent:
    return NewEvent(org_id=pe.DEPLOYMENT_ORG, subject_type=subject_type, subject_id=subject_id, payload=payload)


async def commit(conn: AsyncConnection, events: list[NewEvent]) -> None:
    """Fold, then append (the journal lock is the transaction's last step)."""
    for e in events:
        await _fold_one(conn, e.payload)
    await append(conn, events)


async def _fold_one(conn: AsyncConnection, p) -> None:
    if isinstance(p, pe.PluginRegistered):
        await conn.execute(
            "INSERT INTO plugin_registrations (registration_id, plugin_id, version, endpoint, manifest,"
            " manifest_digest, artifact_digest, settings, contributions, roles, state, origin, has_token,"
            " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (p.registration_id, p.plugin_id, p.version, p.endpoint, p.manifest, p.manifest_digest,
             None if p.artifact_digest is msgspec.UNSET else p.artifact_digest, Jsonb(p.settings),
             Jsonb(p.contributions), Jsonb(p.roles), p.state, p.origin, p.has_token, p.created_at, p.created_at))
    elif isinstance(p, pe.PluginChecked):
        await conn.execute(
            "UPDATE plugin_registrations SET check_report = %s, updated_at = %s,"
            " state = coalesce(%s, state) WHERE registration_id = %s",
            (Jsonb(p.check), p.checked_at, None if p.state is msgspec.UNSET else p.state, p.registration_id))
    elif isinstance(p, pe.PluginStateChanged):
        await conn.execute("UPDATE plugin_registrations SET state = %s, updated_at = %s WHERE registration_id = %s",
                           (p.state, p.changed_at, p.registration_id))
    elif isinstance(p, pe.PluginPlanCommitted):
        await conn.execute(
            "INSERT INTO plugin_plans (plan_id, source, previous_plan_id, roles, configuration_pins, pinned_work,"
            " created_at, activated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (p.plan_id, p.source, None if p.previous_plan_id is msgspec.UNSET else p.previous_plan_id,
             Jsonb(msgspec.to_builtins(p.roles)),
             None if p.configuration_pins is msgspec.UNSET else Jsonb(p.configuration_pins),
             None if p.pinned_work is msgspec.UNSET else p.pinned_work, p.created_at, p.activated_at))


# ---------------------------------------------------------------- registrations


@dataclass(frozen=True)
class Registration:
    """A registration row as the commands, the worker and the plan cache use it."""

    registration_id: str
    plugin_id: str
    version: str
    endpoint: str
    manifest: str
    manifest_digest: str
    artifact_digest: str | None
    settings: dict
    contributions: list[str]
    roles: list[str]
    state: str
    origin: str
    has_token: bool
    check_report: dict | None
    created_at: str
    updated_at: str

    def candidate(self) -> Candidate:
        return candidate_of(self.registration_id, stored_manifest(self.manifest).manifest, self.roles)

    def view(self) -> PluginRegistration:
        return PluginRegistration(registration_id=self.registration_id, plugin_id=self.plugin_id,
                                  version=self.version, endpoint=self.endpoint, manifest_digest=self.manifest_digest,
                                  contributions=self.contributions, roles=self.roles, state=self.state,
                                  created_at=self.created_at, updated_at=self.updated_at,
                                  artifact_digest=self.artifact_digest)

    def detail(self, pinned_work: int) -> PluginRegistrationDetail:
        return PluginRegistrationDetail(**msgspec.structs.asdict(self.view()), pinned_work=pinned_work,
                                        check=None if self.check_report is None else msgspec.convert(self.check_report,
                                                                                              CheckObject))


_REGISTRATION_COLUMNS = """registration_id, plugin_id, version, endpoint, manifest, manifest_digest, artifact_digest,
    settings, contributions, roles, state, origin, has_token, check_report, created_at, updated_at"""


def _registration(row: dict) -> Registration:
    row = dict(row)
    row["created_at"], row["updated_at"] = iso(row["created_at"]), iso(row["updated_at"])
    return Registration(**row)


async def registration(conn: AsyncConnection, registration_id: str) -> Registration | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT {_REGISTRATION_COLUMNS} FROM plugin_registrations WHERE registration_id = %s",
                      (registration_id,))
    row = await cur.fetchone()
    return None if row is None else _registration(row)


async def registrations(conn: AsyncConnection, where: str = "TRUE", params: tuple = (),
                        limit: int | None = None) -> list[Registration]:
    """Registrations oldest first (ids are ULIDs: id order is creation order)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT {_REGISTRATION_COLUMNS} FROM plugin_registrations WHERE {where}"
                      f" ORDER BY registration_id{'' if limit is None else f' LIMIT {int(limit)}'}", params)
    return [_registration(row) for row in await cur.fetchall()]


async def pinned_work(conn: AsyncConnection, registration_id: str) -> int:
    """Unfinished work pinned to a plan that names the registration while that plan is not active
    (decisions-part2): receipt processing, connector runs, rebuilds and backfills record the plan
    they started under. Receipt processing waiting for a normalizer records its plan and
    registration (materializer_deferred); a connector run records its plan (connector_runs)."""
    active = await active_plan(conn)
    active_id = active.plan_id if active else None
    cur = await conn.execute("SELECT count(*) FROM materializer_deferred WHERE registration_id = %s"
                             " AND plan_id IS DISTINCT FROM %s", (registration_id, active_id))
    deferred = (await cur.fetchone())[0]
    # Connector runs under way on a plan that names the registration (connectors/worker.py).
    cur = await conn.execute(
        "SELECT count(*) FROM connector_runs r JOIN plugin_plans p ON p.plan_id = r.plan_id"
        " WHERE r.state = 'running' AND r.plan_id IS DISTINCT FROM %s"
        " AND p.roles @> jsonb_build_array(jsonb_build_object('registration_id', %s::text))", (active_id, registration_id))
    return deferred + (await cur.fetchone())[0]


# ---------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    plan_id: str
    source: str
    previous_plan_id: str | None
    roles: list[pe.PlanRole]
    configuration_pins: dict[str, str] | None
    created_at: str
    activated_at: str

    @property
    def role_map(self) -> dict[str, str]:
        return {r.role: r.registration_id for r in self.roles}

    def view(self) -> PipelinePlan:
        return PipelinePlan(plan_id=self.plan_id, created_at=self.created_at, activated_at=self.activated_at,
                            source=self.source, previous_plan_id=self.previous_plan_id,
                            roles=[PlanRoleView(role=r.role, registration_id=r.registration_id,
                                                plugin_id=r.plugin_id, version=r.version) for r in self.roles])


_PLAN_COLUMNS = "seq, plan_id, source, previous_plan_id, roles, configuration_pins, created_at, activated_at"


def _plan(row: dict) -> Plan:
    return Plan(plan_id=row["plan_id"], source=row["source"], previous_plan_id=row["previous_plan_id"],
                roles=msgspec.convert(row["roles"], list[pe.PlanRole]), configuration_pins=row["configuration_pins"],
                created_at=iso(row["created_at"]), activated_at=iso(row["activated_at"]))


async def _plans(conn: AsyncConnection, where: str, params: tuple, limit: int) -> list[tuple[int, Plan]]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(f"SELECT {_PLAN_COLUMNS} FROM plugin_plans WHERE {where} ORDER BY seq DESC LIMIT %s",
                      (*params, limit))
    return [(row["seq"], _plan(row)) for row in await cur.fetchall()]


async def active_plan(conn: AsyncConnection) -> Plan | None:
    """The active plan: the one committed last."""
    found = await _plans(conn, "TRUE", (), 1)
    return found[0][1] if found else None


async def active_plan_id(conn: AsyncConnection) -> str | None:
    """The active plan's id alone: what a cache of plans keyed by id reads on every use."""
    cur = await conn.execute("SELECT plan_id FROM plugin_plans ORDER BY seq DESC LIMIT 1")
    row = await cur.fetchone()
    return row[0] if row else None


async def every_plan(conn: AsyncConnection) -> list[Plan]:
    """Every plan, oldest first (what vector-space ownership reads: the spaces ever served)."""
    return [p for _, p in reversed(await _plans(conn, "TRUE", (), 2**31 - 1))]


async def plan(conn: AsyncConnection, plan_id: str) -> Plan | None:
    found = await _plans(conn, "plan_id = %s", (plan_id,), 1)
    return found[0][1] if found else None


async def plan_before(conn: AsyncConnection, plan_id: str) -> Plan | None:
    found = await _plans(conn, "seq < (SELECT seq FROM plugin_plans WHERE plan_id = %s)", (plan_id,), 1)
    return found[0][1] if found else None


async def last_configuration_plan(conn: AsyncConnection) -> Plan | None:
    found = await _plans(conn, "source = 'configuration'", (), 1)
    return found[0][1] if found else None


async def plans_page(conn: AsyncConnection, after_seq: int | None, limit: int) -> list[tuple[int, Plan]]:
    """Plans newest first, after a keyset position (a seq) when paging on."""
    if after_seq is None:
        return await _plans(conn, "TRUE", (), limit)
    return await _plans(conn, "seq < %s", (after_seq,), limit)


async def commit_plan(conn: AsyncConnection, source: str, roles: dict[str, str], active: Plan | None,
                      by_id: dict[str, Registration], now: str, *, configuration_pins: dict[str, str] | None = None,
                      pinned_work_option: str | None = None, plan_id: str | None = None) -> Plan:
    """Commits a new plan with the state moves it causes (part 2 "Plugin registration" states):
    registrations it brings in become `active`; those it leaves become `draining` while work is
    pinned to them, else `inactive` at once. Call with the registry lock held."""
    plan_id = plan_id or new_id("plan")
    payload = pe.PluginPlanCommitted(
        plan_id=plan_id, source=source, created_at=now, activated_at=now,
        roles=[pe.PlanRole(role=role, registration_id=rid, plugin_id=by_id[rid].plugin_id,
                           version=by_id[rid].version) for role, rid in sorted(roles.items())],
        previous_plan_id=active.plan_id if active is not None else msgspec.UNSET,
        configuration_pins=configuration_pins if configuration_pins is not None else msgspec.UNSET,
        pinned_work=pinned_work_option if pinned_work_option is not None else msgspec.UNSET)
    events = [event(payload, "plugin_plan", plan_id)]
    before = set(active.role_map.values()) if active is not None else set()
    after = set(roles.values())
    for rid in sorted(after):
        if by_id[rid].state != "active":
            events.append(event(pe.PluginStateChanged(registration_id=rid, state="active", changed_at=now,
                                                      plan_id=plan_id), "plugin_registration", rid))
    for rid in sorted(before - after):
        if by_id[rid].state in ("active", "draining"):
            state = "draining" if await pinned_work(conn, rid) > 0 else "inactive"
            if state != by_id[rid].state:
                events.append(event(pe.PluginStateChanged(registration_id=rid, state=state, changed_at=now,
                                                          plan_id=plan_id), "plugin_registration", rid))
    await commit(conn, events)
    log.info("plugin_plan_committed", plan_id=plan_id, source=source,
             roles={role: f"{by_id[rid].plugin_id} {by_id[rid].version}" for role, rid in sorted(roles.items())})
    return Plan(plan_id=plan_id, source=source, previous_plan_id=active.plan_id if active else None,
                roles=payload.roles, configuration_pins=configuration_pins, created_at=now, activated_at=now)
