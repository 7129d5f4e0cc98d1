"""The Connector commands (part 2 "Connector management", "Credential bodies"; decisions-part2
"Create, read, list", "Commands on a Connector").

Each runs in one journal transaction: the idempotency claim, the Connector's row lock, the
checks against what is committed, the row written, and the public change event
(`connector.created` / `connector.changed`, in the Connector's Corpus). A refusal rolls it all
back, the claim with it.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable

import msgspec

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.commands.records import Accepted, SourceCommand, accept_in_transaction
from contentsvc.config import Settings
from contentsvc.config.limits import MAX_CONNECTOR_INTERVAL_SECONDS
from contentsvc.connectors import views
from contentsvc.connectors.credentials import credentials_unavailable, seal_credential
from contentsvc.connectors.events import (
    CONNECTOR_SUBJECT,
    RUN_SUBJECT,
    ConnectorChanged,
    ConnectorCreated,
    ConnectorRunChanged,
)
from contentsvc.connectors.health import health_of
from contentsvc.connectors.kinds import ServedKind, served_kind, served_kinds
from contentsvc.connectors.pages import item_command
from contentsvc.connectors.shapes import ConnectorCreate, connector_disabled, CredentialReplace, HealthPolicy, PushPolicy, RunRequest
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.domain.decoding import nul_pointer
from contentsvc.domain.models import Part
from contentsvc.ids import new_id
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.plugins.manifest import validate_against
from contentsvc.readmodel.corpora import existing_corpora
from contentsvc.storage import sealed
from contentsvc.storage.database import database_now

CONNECTOR = "connector"  # idempotency families (decisions-part2)
RUN = "connector_run"
MAX_INTERVAL = MAX_CONNECTOR_INTERVAL_SECONDS
SILENT_BOUNDS, SILENT_DEFAULT = (60, 2592000), 86400
WARNING_BOUNDS, WARNING_DEFAULT = (0, 2592000), 604800


def invalid_config(message: str, field: str) -> ApiError:
    return ApiError(422, "invalid_config", message, field=field)


def _check_schema(schema: Any, instance: Any, prefix: str, what: str) -> None:
    issues = validate_against(schema, instance)
    if issues:
        first = issues[0]
        raise invalid_config(f"The {what} does not satisfy the kind's schema at {first.pointer or '/'}: "
                             f"{first.message}", prefix + first.pointer)


def check_credential_shape(served: ServedKind, secret: dict | None, present: bool) -> None:
    """Given for a `none` kind, missing for a `required` one, or failing `credential_schema`: 422."""
    declared = served.description.credential
    if present and declared == "none":
        raise invalid_config(f"Connector kind {served.kind!r} takes no credential.", "/credential")
    if not present and declared == "required":
        raise invalid_config(f"Connector kind {served.kind!r} requires a credential.", "/credential")
    if present and served.description.credential_schema is not None:
        _check_schema(served.description.credential_schema, secret, "/credential/secret", "credential")


def check_interval(settings: Settings, interval: int, field: str) -> None:
    floor = settings.connectors.interval_floor_seconds
    if not floor <= interval <= MAX_INTERVAL:
        raise ApiError(422, "invalid_interval", f"interval_seconds must be between {floor} and {MAX_INTERVAL}.",
                       field=field)


def effective_health_policy(policy: HealthPolicy | None, interval: int) -> dict[str, int]:
    silent = SILENT_DEFAULT if policy is None or policy.silent_after_seconds is None else policy.silent_after_seconds
    warning = WARNING_DEFAULT if policy is None or policy.credential_warning_seconds is None \
        else policy.credential_warning_seconds
    if not SILENT_BOUNDS[0] <= silent <= SILENT_BOUNDS[1]:
        raise invalid_config("silent_after_seconds must be between 60 and 2592000.",
                             "/health_policy/silent_after_seconds")
    if silent < interval:
        raise invalid_config("silent_after_seconds must be at least the schedule's interval.",
                             "/health_policy/silent_after_seconds")
    if not WARNING_BOUNDS[0] <= warning <= WARNING_BOUNDS[1]:
        raise invalid_config("credential_warning_seconds must be between 0 and 2592000.",
                             "/health_policy/credential_warning_seconds")
    return {"silent_after_seconds": silent, "credential_warning_seconds": warning}


def effective_push_policy(settings: Settings, served: ServedKind, policy: PushPolicy | None) -> dict | None:
    """Push kinds only (else 422 `/push_policy`); absent members take the deployment defaults."""
    if served.description.push is None:
        if policy is not None:
            raise invalid_config(f"Connector kind {served.kind!r} declares no push.", "/push_policy")
        return None
    policy = policy or PushPolicy()
    out: dict[str, Any] = {"rate_per_second": settings.connectors.push_rate_per_second
                           if policy.rate_per_second is None else policy.rate_per_second,
                           "burst": settings.connectors.push_burst if policy.burst is None else policy.burst}
    if not 0.1 <= out["rate_per_second"] <= 1000:
        raise invalid_config("rate_per_second must be between 0.1 and 1000.", "/push_policy/rate_per_second")
    if not 1 <= out["burst"] <= 10000:
        raise invalid_config("burst must be between 1 and 10000.", "/push_policy/burst")
    if policy.allowed_cidrs is not None:
        if len(policy.allowed_cidrs) > 64:
            raise invalid_config("At most 64 allowed_cidrs.", "/push_policy/allowed_cidrs")
        for n, cidr in enumerate(policy.allowed_cidrs):
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise invalid_config(f"{cidr!r} is not an IPv4 or IPv6 CIDR.",
                                     f"/push_policy/allowed_cidrs/{n}") from None
        out["allowed_cidrs"] = policy.allowed_cidrs
    return out


def _utc(value: datetime | None) -> datetime | None:
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=timezone.utc)


def changed_event(row: dict[str, Any], change: str, now: datetime, **details: Any) -> NewEvent:
    payload = ConnectorChanged(connector_id=row["connector_id"], change=change, changed_at=iso(now),
                               health_state=row["health"]["state"])
    if details:
        payload.details = details
    return NewEvent(org_id=row["org_id"], corpus_id=row["corpus_id"], subject_type=CONNECTOR_SUBJECT,
                    subject_id=row["connector_id"], payload=payload)


def run_event(run: dict[str, Any], now: datetime) -> NewEvent:
    payload = ConnectorRunChanged(connector_id=run["connector_id"], run_id=run["run_id"], state=run["state"],
                                  pages=run["pages"], receipts_created=run["receipts_created"],
                                  changed_at=iso(now))
    if run.get("error"):
        payload.error_code = run["error"]["code"]
    return NewEvent(org_id=run["org_id"], corpus_id=run["corpus_id"], subject_type=RUN_SUBJECT,
                    subject_id=run["run_id"], payload=payload)


async def create_connector(conn: AsyncConnection, settings: Settings, p: Principal,
                           req: ConnectorCreate) -> tuple[str, bool]:
    """Returns (connector_id, replayed); the refusals in decisions-part2's order."""
    if not p.covers(req.corpus_id):
        raise ApiError(403, "forbidden", f"The API key's Corpus scope does not include {req.corpus_id!r}.",
                       field="/corpus_id")
    if req.corpus_id not in await existing_corpora(conn, p.org_id, [req.corpus_id]):
        raise not_found(f"corpus {req.corpus_id!r}")
    served = await served_kind(conn, settings, req.kind)
    _check_schema(served.description.config_schema, req.config, "/config", "config")
    check_credential_shape(served, req.credential.secret if req.credential else None, req.credential is not None)
    if req.credential is not None and not sealed.can_seal(settings):
        raise credentials_unavailable()
    interval = served.description.default_interval_seconds if req.schedule is None else req.schedule.interval_seconds
    check_interval(settings, interval, "/schedule/interval_seconds")
    health_policy = effective_health_policy(req.health_policy, interval)
    push_policy = effective_push_policy(settings, served, req.push_policy)

    connector_id = new_id("con")
    async with journal_transaction(conn):
        # One enabled Connector per (Corpus, namespace): creators of one namespace take turns.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                           (f"connector_namespace:{req.corpus_id}:{req.source_namespace}",))
        prior = await idempotency.claim_one(conn, p.org_id, CONNECTOR, req.idempotency_key, request_digest(req),
                                            201, "connector", connector_id)
        if prior is not None:
            return prior, True
        cur = await conn.execute("SELECT 1 FROM connectors WHERE corpus_id = %s AND source_namespace = %s"
                                 " AND enabled", (req.corpus_id, req.source_namespace))
        if await cur.fetchone() is not None:
            raise ApiError(409, "namespace_in_use", "Another enabled Connector writes this Corpus's source namespace.",
                           field="/source_namespace")
        now = await database_now(conn)
        credential, expires = None, None
        if req.credential is not None:
            credential = seal_credential(settings, connector_id, 1, req.credential.secret)
            expires = _utc(req.credential.expires_at)
        row = {"connector_id": connector_id, "org_id": p.org_id, "corpus_id": req.corpus_id,
               "created_at": now, "enabled": True, "last_item_at": None, "last_success_at": None,
               "credential_expires_at": expires, "health_policy": health_policy, "usage_day": None,
               "items_read_today": 0, "items_read_previous_day": 0, "health": {"push": {"state": "pending"}}
               if served.description.push is not None and served.description.push.relay else {}}
        health = health_of(views.facts(row), now)
        await conn.execute(
            """INSERT INTO connectors (connector_id, org_id, corpus_id, source_namespace, kind, plugin_id, config,
                   interval_seconds, health_policy, push_policy, created_at, health, credential, credential_version,
                   credential_deposited_at, credential_expires_at, next_run_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
            (connector_id, p.org_id, req.corpus_id, req.source_namespace, req.kind, served.plugin_id,
             Jsonb(req.config), interval, Jsonb(health_policy), None if push_policy is None else Jsonb(push_policy),
             now, Jsonb(health), None if credential is None else Jsonb(credential), 1 if credential else 0,
             now if credential else None, expires, now))
        await append(conn, [NewEvent(org_id=p.org_id, corpus_id=req.corpus_id, subject_type=CONNECTOR_SUBJECT,
                                     subject_id=connector_id,
                                     payload=ConnectorCreated(connector_id=connector_id, connector_kind=req.kind,
                                                              source_namespace=req.source_namespace,
                                                              created_at=iso(now)))])
    return connector_id, False


async def _locked(conn: AsyncConnection, p: Principal, connector_id: str) -> dict[str, Any]:
    """The Connector's row, locked until the command commits. The worker locks the same row to queue,
    start, page and finish its runs, so a command and the worker take turns on a Connector (a lock
    of the command's own let a run request and a scheduled run both queue one)."""
    row = await views.visible_connector(conn, p, connector_id, lock=True)
    if row is None:
        raise not_found("connector")
    return row


async def disable_connector(conn: AsyncConnection, p: Principal, connector_id: str) -> None:
    """Final in v0: health `disabled`, no next run, queued runs skipped; a repeat commits nothing."""
    async with journal_transaction(conn):
        row = await _locked(conn, p, connector_id)
        if not row["enabled"]:
            return
        now = await database_now(conn)
        row["enabled"] = False
        health = views.evaluated_health(row, now)
        await conn.execute("UPDATE connectors SET enabled = false, disabled_at = %s, next_run_at = NULL,"
                           " health = %s, revision = revision + 1 WHERE connector_id = %s",
                           (now, Jsonb(health), connector_id))
        cur = conn.cursor()
        await cur.execute(
            "UPDATE connector_runs SET state = 'skipped', notice = 'connector_disabled', finished_at = %s"
            " WHERE connector_id = %s AND state = 'queued'"
            " RETURNING run_id, connector_id, org_id, corpus_id, state, pages, receipts_created, error",
            (now, connector_id))
        skipped = [dict(zip(("run_id", "connector_id", "org_id", "corpus_id", "state", "pages", "receipts_created",
                             "error"), r)) for r in await cur.fetchall()]
        row["health"] = health
        await append(conn, [changed_event(row, "disabled", now), *(run_event(r, now) for r in skipped)])


async def replace_credential(conn: AsyncConnection, settings: Settings, p: Principal, connector_id: str,
                             req: CredentialReplace) -> None:
    """version + 1 (family `connector_credential:{id}`); 503 without a key, 409 once disabled."""
    async with journal_transaction(conn):
        row = await _locked(conn, p, connector_id)
        if not sealed.can_seal(settings):
            raise credentials_unavailable()
        if not row["enabled"]:
            raise connector_disabled()
        prior = await idempotency.claim_one(conn, p.org_id, f"connector_credential:{connector_id}",
                                            req.idempotency_key, request_digest(req, connector=connector_id),
                                            200, "connector", connector_id)
        if prior is not None:
            return
        served = (await served_kinds(conn, settings)).get(row["kind"])
        if served is not None:  # a kind no longer served keeps its credential replaceable
            check_credential_shape(served, req.secret, True)
        version = row["credential_version"] + 1
        now = await database_now(conn)
        stored = seal_credential(settings, connector_id, version, req.secret)
        row["credential_expires_at"] = _utc(req.expires_at)
        health = views.evaluated_health(row, now)
        await conn.execute(
            "UPDATE connectors SET credential = %s, credential_version = %s, credential_deposited_at = %s,"
            " credential_expires_at = %s, health = %s, revision = revision + 1 WHERE connector_id = %s",
            (Jsonb(stored), version, now, row["credential_expires_at"], Jsonb(health), connector_id))
        row["health"] = health
        await append(conn, [changed_event(row, "credential_replaced", now, version=version)])


async def change_schedule(conn: AsyncConnection, settings: Settings, p: Principal, connector_id: str,
                          interval: int) -> None:
    """The next scheduled run moves to the last scheduled start + the new interval, or now when past."""
    check_interval(settings, interval, "/interval_seconds")
    async with journal_transaction(conn):
        row = await _locked(conn, p, connector_id)
        if not row["enabled"]:
            raise connector_disabled()
        if row["interval_seconds"] == interval:
            return
        now = await database_now(conn)
        last = row["last_scheduled_start"]
        next_run = now if last is None else max(now, last + timedelta(seconds=interval))
        await conn.execute("UPDATE connectors SET interval_seconds = %s, next_run_at = %s, revision = revision + 1"
                           " WHERE connector_id = %s", (interval, next_run, connector_id))
        await append(conn, [changed_event(row, "schedule_changed", now, interval_seconds=interval)])


async def request_run(conn: AsyncConnection, settings: Settings, p: Principal, connector_id: str,
                      req: RunRequest) -> dict[str, Any]:
    """A queued `request` run (an existing queued run instead of a second one); run_at = max(now,
    last run start + the interval floor, the source's retry-after deadline)."""
    async with journal_transaction(conn):
        row = await _locked(conn, p, connector_id)
        if not row["enabled"]:
            raise connector_disabled()
        # The key records the run it is answered with: a queued one, else the one made here.
        queued = await conn.execute("SELECT run_id FROM connector_runs WHERE connector_id = %s AND state = 'queued'",
                                    (connector_id,))
        existing = await queued.fetchone()
        run_id = new_id("run") if existing is None else existing[0]
        prior = await idempotency.claim_one(conn, p.org_id, RUN, req.idempotency_key,
                                            request_digest(req, connector=connector_id), 202, "connector_run", run_id)
        if prior is not None:
            return await views.run_row(conn, connector_id, prior)
        if existing is not None:
            return await views.run_row(conn, connector_id, run_id)
        now = await database_now(conn)
        floor = timedelta(seconds=settings.connectors.interval_floor_seconds)
        candidates = [now, row["retry_after_until"],
                      None if row["last_run_started_at"] is None else row["last_run_started_at"] + floor]
        run_at = max(c for c in candidates if c is not None)
        run = await queue_run(conn, row, "request", run_at, now, run_id)
        return run


async def queue_run(conn: AsyncConnection, row: dict[str, Any], trigger: str, run_at: datetime, now: datetime,
                    run_id: str | None = None) -> dict[str, Any]:
    """Inside the caller's transaction: a queued run and its `connector.run.changed`."""
    run = {"run_id": run_id or new_id("run"), "connector_id": row["connector_id"], "org_id": row["org_id"],
           "corpus_id": row["corpus_id"], "trigger": trigger, "state": "queued", "pages": 0, "items_seen": 0,
           "receipts_created": 0, "items_rejected": 0, "run_at": run_at, "plan_id": None, "started_at": None,
           "finished_at": None, "error": None, "notice": None}
    await conn.execute("INSERT INTO connector_runs (run_id, connector_id, org_id, corpus_id, trigger, state, run_at)"
                       " VALUES (%s, %s, %s, %s, %s, 'queued', %s)",
                       (run["run_id"], run["connector_id"], run["org_id"], run["corpus_id"], trigger, run_at))
    await append(conn, [run_event(run, now)])
    return run


# ---------------------------------------------------------------- items, pulled or pushed

PRODUCER = "contentsvc"  # provenance producer of the built-in kind's items


def connector_principal(row: dict[str, Any]) -> Principal:
    """Who ingests a Connector's items: its Organization, writing its Corpus only (and reading the
    Blobs of the items' attachments, which its worker uploaded)."""
    return Principal(key_id=f"connector:{row['connector_id']}", org_id=row["org_id"],
                     actions=frozenset({"content:write", "blobs:read"}), corpora=frozenset({row["corpus_id"]}))


def item_commands(served: ServedKind, row: dict[str, Any], items: list[dict[str, Any]],
                  invalid: Iterable[int] = (), attached: dict[int, list[Part]] | None = None
                  ) -> list[SourceCommand | ApiError]:
    """Each item as the ingest or withdrawal command a client would send (keys
    `con:{connector_id}:{record_key}:{revision}`, so pulled and pushed items converge on one
    Receipt), with the Blob Parts of its uploaded attachments (`attached`, by item index). An item
    that is not a valid item (or is listed in `invalid`) is 422 item_rejected; so is one holding
    U+0000 anywhere, which a client's ingest may not carry either (a JSON Feed can escape it)."""
    attached = attached or {}
    producer = served.plugin_id or PRODUCER
    version = served.provider.version if served.provider else None
    invalid = set(invalid)
    commands: list[SourceCommand | ApiError] = []
    for n, item in enumerate(items):
        try:
            if n in invalid:
                raise msgspec.ValidationError("the item breaks the fetch protocol")
            if nul_pointer(item) is not None:
                raise msgspec.ValidationError("PostgreSQL stores no U+0000")
            commands.append(item_command(row, producer, version, item, attached.get(n, [])))
        except (msgspec.ValidationError, KeyError, TypeError):
            commands.append(ApiError(422, "item_rejected", "The item is not a valid connector item."))
    return commands


async def accept_items(conn: AsyncConnection, served: ServedKind, row: dict[str, Any], items: list[dict[str, Any]],
                       invalid: Iterable[int] = (), attached: dict[int, list[Part]] | None = None
                       ) -> list[Accepted | ApiError]:
    """The items' commands (item_commands) accepted inside the caller's journal transaction; the
    results in item order."""
    return await accept_in_transaction(conn, connector_principal(row),
                                       item_commands(served, row, items, invalid, attached))
