"""The plugin administration commands: register, activate, roll back (decisions-part2
"Registration request", "Activation, plans, rollback"). Each runs one transaction holding the
registry lock (plugins/registry.py), claims its idempotency key deployment-wide, and commits
its events with their inline fold."""

from __future__ import annotations

import msgspec
from psycopg import AsyncConnection

from contentsvc.commands import idempotency
from contentsvc.config import Settings
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import utc_now
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.ids import new_id
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.plugins import events as pe
from contentsvc.plugins import registry, store
from contentsvc.plugins.client import PluginClient, PluginTarget, PluginUnreachable
from contentsvc.plugins.planning import (
    Candidate,
    SpaceDefinition,
    activation_roles,
    changed_source_formats,
    plan_conflicts,
    rollback_roles,
    spaces_served,
    transition_conflicts,
)
from contentsvc.plugins.registry import Plan, Registration
from contentsvc.plugins.shapes import (
    ActivationRequest,
    RegistrationRequest,
    RollbackRequest,
    check_registration,
)
from contentsvc.readmodel.vectors import uncovered_current_versions
from contentsvc.search.embedding import DIMENSIONS, METRIC, MODEL_NAME
from contentsvc.search.engine_space import SPACE

REGISTRATION = "plugin_registration"
ACTIVATION = "plugin_activation"
ROLLBACK = "plugin_rollback"
ACTIVATABLE = ("validated", "inactive", "draining")


async def register(conn: AsyncConnection, settings: Settings, req: RegistrationRequest) -> tuple[Registration, bool]:
    """A new registration in state `registered` (its contract check queued for the `plugins` worker);
    a replay answers the same registration as it is now."""
    checked = check_registration(req)
    registration_id = new_id("preg")
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, pe.DEPLOYMENT_ORG, REGISTRATION, req.idempotency_key,
                                            request_digest(req), 202, "plugin_registration", registration_id)
        if prior is None:
            await registry.lock(conn)
            store.write_fixtures(settings.home, registration_id, checked.fixtures)
            if req.token is not None:
                store.write_token(settings, registration_id, req.token)
            manifest = checked.pinned.manifest
            payload = pe.PluginRegistered(
                registration_id=registration_id, plugin_id=manifest.id, version=manifest.version,
                endpoint=checked.endpoint, manifest=req.manifest, manifest_digest=checked.pinned.digest,
                settings=msgspec.to_builtins(checked.settings), contributions=manifest.contributions.names(),
                roles=checked.roles, state="registered", origin="request", created_at=utc_now(),
                artifact_digest=req.artifact_digest if req.artifact_digest is not None else msgspec.UNSET,
                has_token=req.token is not None, fixture_paths=[path for path, _ in checked.fixtures])
            await registry.commit(conn, [registry.event(payload, "plugin_registration", registration_id)])
            registry.log.info("plugin_registered", registration_id=registration_id, plugin_id=manifest.id,
                              version=manifest.version)
    found = await registry.registration(conn, prior or registration_id)
    return found, prior is not None


async def _replayed(conn: AsyncConnection, family: str, key: str, digest: bytes) -> Plan | None:
    """The plan a key produced before (a replay), or None when the key is fresh; a changed request
    under a used key is 409 idempotency_conflict."""
    cur = await conn.execute("SELECT request_digest, resource_id FROM idempotency_keys"
                             " WHERE org_id = %s AND family = %s AND key = %s", (pe.DEPLOYMENT_ORG, family, key))
    row = await cur.fetchone()
    if row is None:
        return None
    if bytes(row[0]) != digest:
        raise idempotency.conflict()
    return await registry.plan(conn, row[1])


async def _verify_build(settings: Settings, found: Registration) -> None:
    """409 plugin_unreachable unless the registration's address answers discovery with its build."""
    target = PluginTarget(found.plugin_id, found.version, found.manifest_digest, found.endpoint,
                          store.read_token(settings, found.registration_id))
    try:
        async with PluginClient(target) as client:
            await client.verify()
    except PluginUnreachable as exc:
        raise ApiError(409, "plugin_unreachable", f"Plugin {found.plugin_id} {found.version} at its registered "
                                                  f"address is unreachable ({exc.cause}): {exc}") from None


async def _candidates(conn: AsyncConnection) -> dict[str, Registration]:
    return {r.registration_id: r for r in await registry.registrations(conn)}


# The engine owns its vector space (part 1 "Corpus vector space": owner engine or an ingestion
# plugin): a plugin declaring a space of that name must not change what its vectors are.
ENGINE_SPACES = (SpaceDefinition(SPACE, MODEL_NAME, DIMENSIONS, METRIC),)


async def _refuse_breaks(conn: AsyncConnection, active: dict[str, str], roles: dict[str, str],
                         candidates: dict[str, Candidate], *, activation: bool) -> None:
    """409 plugin_conflict listing every startup rule the new plan breaks (part 2 "Activation
    rules"), then the coverage rule: changing the ingestion plugin serving a source format needs
    complete primary-vector coverage of every current Version. Call with the registry lock held,
    before anything is committed: a refusal leaves the plan unchanged."""
    history = [plan.role_map for plan in await registry.every_plan(conn)]
    breaks = plan_conflicts(roles, candidates) + transition_conflicts(
        active, roles, candidates, activation=activation,
        known_spaces=spaces_served(history, candidates, ENGINE_SPACES))
    changed = changed_source_formats(active, roles, candidates)
    if changed:
        versions, corpora = await uncovered_current_versions(conn)
        if versions:
            breaks.append(f"primary-vector coverage: changing the ingestion plugin serving source format"
                          f"{'s' if len(changed) > 1 else ''} {', '.join(changed)} needs every current Version "
                          f"embedded, and {versions} current Version{'s' if versions > 1 else ''} in {corpora} "
                          f"Corp{'ora' if corpora > 1 else 'us'} still lack{'' if versions > 1 else 's'} their "
                          "primary vectors (listVectorSpaces shows each Corpus's coverage)")
    if breaks:
        raise ApiError(409, "plugin_conflict", "The plan would break the startup rules: " + "; ".join(breaks))


async def activate(conn: AsyncConnection, settings: Settings, registration_id: str,
                   req: ActivationRequest) -> Plan:
    """decisions-part2 refusal order: 404, 422 unsupported_role, 409 registration_not_validated,
    409 plugin_unreachable, 409 plugin_conflict. Already active: the active plan, nothing committed."""
    digest = request_digest(req, registration_id=registration_id)
    replayed = await _replayed(conn, ACTIVATION, req.idempotency_key, digest)
    if replayed is not None:
        return replayed
    found = await registry.registration(conn, registration_id)
    if found is None:
        raise not_found("plugin registration")
    if "subscription" in found.contributions:
        raise ApiError(422, "unsupported_role", "A subscription (alert-rule) plugin cannot be activated: the "
                                                "startup configuration pins it.")
    active = await registry.active_plan(conn)
    if found.state == "active" and active is not None and registration_id in active.role_map.values():
        return active
    if found.state not in ACTIVATABLE:
        raise ApiError(409, "registration_not_validated", f"The registration is {found.state}: only a validated, "
                                                          "inactive or draining registration can be activated.")
    await _verify_build(settings, found)
    async with journal_transaction(conn):
        await registry.lock(conn)
        by_id = await _candidates(conn)
        active = await registry.active_plan(conn)
        current = by_id[registration_id]
        if current.state == "active" and active is not None and registration_id in active.role_map.values():
            return active  # a concurrent activation won
        if current.state not in ACTIVATABLE:
            raise ApiError(409, "registration_not_validated", f"The registration is {current.state}.")
        candidates = {rid: r.candidate() for rid, r in by_id.items()}
        before = active.role_map if active else {}
        roles = activation_roles(before, candidates, candidates[registration_id])
        await _refuse_breaks(conn, before, roles, candidates, activation=True)
        plan_id = new_id("plan")
        prior = await idempotency.claim_one(conn, pe.DEPLOYMENT_ORG, ACTIVATION, req.idempotency_key, digest, 200,
                                            "plugin_plan", plan_id)
        if prior is not None:  # the same request under the same key committed meanwhile
            return await registry.plan(conn, prior)
        return await registry.commit_plan(conn, "activation", roles, active, by_id, utc_now(), plan_id=plan_id)


async def rollback(conn: AsyncConnection, settings: Settings, req: RollbackRequest) -> Plan:
    """A new plan (`source` rollback) with the roles of `plan_id`, else of the plan before the
    active one; a target equal to the active roles commits nothing and answers the active plan."""
    digest = request_digest(req)
    replayed = await _replayed(conn, ROLLBACK, req.idempotency_key, digest)
    if replayed is not None:
        return replayed
    active = await registry.active_plan(conn)
    if active is None:
        raise not_found("plan")
    target = await (registry.plan(conn, req.plan_id) if req.plan_id is not None
                    else registry.plan_before(conn, active.plan_id))
    if target is None:
        raise not_found("plan")
    roles = rollback_roles(active.role_map, target.role_map)
    if roles == dict(sorted(active.role_map.items())):
        return active
    by_id = await _candidates(conn)
    for rid in sorted(set(roles.values()) - set(active.role_map.values())):
        await _verify_build(settings, by_id[rid])
    async with journal_transaction(conn):
        await registry.lock(conn)
        plan_id = new_id("plan")
        prior = await idempotency.claim_one(conn, pe.DEPLOYMENT_ORG, ROLLBACK, req.idempotency_key, digest, 200,
                                            "plugin_plan", plan_id)
        if prior is not None:
            return await registry.plan(conn, prior)
        by_id = await _candidates(conn)
        now_active = await registry.active_plan(conn)
        if now_active.plan_id != active.plan_id:
            raise ApiError(409, "plugin_conflict", "Another plan was committed meanwhile; send the rollback again.",
                           retryable=True)
        candidates = {rid: r.candidate() for rid, r in by_id.items()}
        # part 2 "Rollback": a rollback that would break a startup rule is refused like an activation
        await _refuse_breaks(conn, active.role_map, roles, candidates, activation=False)
        return await registry.commit_plan(conn, "rollback", roles, active, by_id, utc_now(), plan_id=plan_id,
                                          pinned_work_option=req.pinned_work)
