"""Evaluator migration: `POST /v0/admin/subscriptions/evaluator-migrations` (`plugins:admin`;
part 2 "Evaluator migration (plugins:admin)").

Moves the key's Organization's non-deleted Subscriptions (enabled or disabled) whose current
Version pins `plugin_id` at `from_version`, in Subscription id order, to the version the active
plan serves for `subscription:<plugin_id>`:

- 422 unsupported_evaluator when no version of the plugin serves new Subscriptions; 422
  invalid_migration when `from_version` is that version.
- Subscriptions whose Corpora (every Corpus any of their Versions pinned, rule 8) the key does not
  all grant are left out, neither moved nor refused.
- Each listed one's expression (its Saved Query Version's) and evaluator configuration are
  validated against the served version's schemas; a failure is listed in `refused`
  (`invalid_expression`, `invalid_subscription_configuration`) and the Subscription keeps its
  version. A Subscription that got another current Version between the listing and its move is
  refused `subscription_changed`.
- A moved one gets a new current Version (monitoring/commands.repin_evaluator, the create-version
  commit): same Saved Query Version, configuration and destination, pinning the served version;
  it judges only later changes, nothing is re-evaluated, Matches keep their Version, and
  `subscription.updated` is emitted in each of its Corpora.
- `dry_run` lists what would move and what is refused, committing nothing (moved items then have
  no `version_id`).
- At most `limit` Subscriptions are listed per call; `next_after` (the last listed id, when the page
  was full) continues. A moved Subscription no longer pins `from_version`, and a refused one is
  passed by `after`, so repeating with `next_after` until it is absent converges.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response
from msgspec import Meta
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.auth.principal import Principal
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Input, Output
from contentsvc.monitoring import commands
from contentsvc.monitoring import events as me
from contentsvc.monitoring.evaluators import ServedEvaluator, served_evaluator
from contentsvc.monitoring.shapes import check_against_evaluator

ADMIN = ("plugins:admin",)
LIMIT_MAX = 500  # part 2 Limits: evaluator migration `limit` 1..500, default 100
LIMIT_DEFAULT = 100
SUBSCRIPTION_CHANGED = "subscription_changed"

Text = Annotated[str, Meta(min_length=1, max_length=256)]


class MigrationRequest(Input, kw_only=True):
    plugin_id: Text
    from_version: Text
    dry_run: bool = False
    limit: Annotated[int, Meta(ge=1, le=LIMIT_MAX)] = LIMIT_DEFAULT
    after: Annotated[str, Meta(min_length=1)] | None = None  # the previous answer's next_after


class Moved(Output, kw_only=True):
    subscription_id: str
    from_version_id: str
    version_id: str | None = None  # absent on a dry run: nothing was committed


class Refused(Output, kw_only=True):
    subscription_id: str
    version_id: str  # the current Version it keeps
    code: str
    field: str | None = None
    message: str


class Migration(Output, kw_only=True):
    plugin_id: str
    from_version: str
    to_version: str
    dry_run: bool
    moved: list[Moved]
    refused: list[Refused]
    next_after: str | None = None


_PINNING = """
SELECT s.subscription_id, s.current_version_id, v.evaluator, q.expression
FROM subscriptions s
JOIN subscription_versions v ON v.version_id = s.current_version_id
JOIN saved_query_versions q ON q.version_id = v.saved_query_version_id
WHERE s.org_id = %s AND NOT s.deleted AND s.subscription_id > %s
  AND v.evaluator->>'plugin_id' = %s AND v.evaluator->>'version' = %s
  AND (%b::text[] IS NULL OR s.scope <@ %b::text[])
ORDER BY s.subscription_id
LIMIT %s
"""


async def pinning(conn: AsyncConnection, p: Principal, plugin_id: str, version: str, after: str | None,
                  limit: int) -> list[dict]:
    """The key's Organization's non-deleted Subscriptions whose current Version pins the evaluator
    at `version`, after `after` in id order, only those whose Corpora the key all grants."""
    scope = None if p.corpora is None else sorted(p.corpora)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_PINNING, (p.org_id, after or "", plugin_id, version, scope, scope, limit))
    return await cur.fetchall()


def refusal(row: dict, served: ServedEvaluator) -> Refused | None:
    """The served version's schemas against the Subscription's expression and configuration
    (rule 6's codes, fields and messages), or None when both validate."""
    try:
        check_against_evaluator(served.expression_schema, served.configuration_schema, row["expression"],
                                row["evaluator"]["configuration"])
    except ApiError as exc:
        return Refused(subscription_id=row["subscription_id"], version_id=row["current_version_id"],
                       code=exc.code, field=exc.field, message=exc.message)
    return None


def changed(row: dict) -> Refused:
    return Refused(subscription_id=row["subscription_id"], version_id=row["current_version_id"],
                   code=SUBSCRIPTION_CHANGED, field=None,
                   message="The Subscription got another current Version during the migration; it keeps it.")


async def migrate(conn: AsyncConnection, p: Principal, req: MigrationRequest) -> Migration:
    served = await served_evaluator(conn, req.plugin_id)
    if served is None:
        raise ApiError(422, "unsupported_evaluator", f"No version of {req.plugin_id!r} serves new Subscriptions.",
                       field="/plugin_id")
    if served.version == req.from_version:
        raise ApiError(422, "invalid_migration", f"{req.plugin_id} {req.from_version} is the version the active "
                                                 "plan serves: there is nothing to migrate to.",
                       field="/from_version")
    rows = await pinning(conn, p, req.plugin_id, req.from_version, req.after, req.limit)
    answer = Migration(plugin_id=req.plugin_id, from_version=req.from_version, to_version=served.version,
                       dry_run=req.dry_run, moved=[], refused=[],
                       next_after=rows[-1]["subscription_id"] if len(rows) == req.limit else None)
    for row in rows:
        refused = refusal(row, served)
        if refused is not None:
            answer.refused.append(refused)
            continue
        if req.dry_run:
            answer.moved.append(Moved(subscription_id=row["subscription_id"], from_version_id=row["current_version_id"]))
            continue
        evaluator = me.Evaluator(plugin_id=served.plugin_id, version=served.version,
                                 configuration=row["evaluator"]["configuration"])
        version_id = await commands.repin_evaluator(conn, p, row["subscription_id"], row["current_version_id"],
                                                    evaluator)
        if version_id is None:
            answer.refused.append(changed(row))
        else:
            answer.moved.append(Moved(subscription_id=row["subscription_id"],
                                      from_version_id=row["current_version_id"], version_id=version_id))
    return answer


@operation("migrateSubscriptionEvaluators", "POST", "/v0/admin/subscriptions/evaluator-migrations",
           permission=ADMIN, body=MigrationRequest, responses={200: Migration})
async def migrate_evaluators(call: Call[MigrationRequest, None]) -> Response:
    async with services(call.request).pool.connection() as conn:
        return respond(await migrate(conn, call.principal, call.body))


ROUTES = [migrate_evaluators]
