"""Which evaluator serves new Subscriptions, and its declared schemas (decisions-part2
"Subscriptions": the installed evaluator is the version the active plan serves for
`subscription:<plugin_id>`; any other is 422 unsupported_evaluator).

Shared by createSubscription and createSubscriptionVersion (monitoring/commands.py), the preview
(monitoring/previews.py) and the evaluator migration (monitoring/migration.py), so all three
refuse and validate alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from contentsvc.domain.errors import ApiError
from contentsvc.plugins import registry
from contentsvc.plugins.manifest import SubscriptionContribution, stored_manifest


@dataclass(frozen=True)
class ServedEvaluator:
    """The registration the active plan serves for `subscription:<plugin_id>`."""

    plugin_id: str
    version: str
    registration_id: str
    contribution: SubscriptionContribution

    @property
    def expression_schema(self) -> Any:
        return self.contribution.expression_schema

    @property
    def configuration_schema(self) -> Any:
        return self.contribution.configuration_schema


async def served_evaluator(conn: AsyncConnection, plugin_id: str) -> ServedEvaluator | None:
    """The evaluator version serving new Subscriptions for `plugin_id`, or None when none does."""
    plan = await registry.active_plan(conn)
    role = next((r for r in (plan.roles if plan else []) if r.role == f"subscription:{plugin_id}"), None)
    if role is None:
        return None
    found = await registry.registration(conn, role.registration_id)
    return ServedEvaluator(plugin_id, role.version, role.registration_id,
                           stored_manifest(found.manifest).manifest.contributions.subscription)


async def installed_evaluator(conn: AsyncConnection, plugin_id: str, version: str,
                              field_prefix: str = "/evaluator") -> ServedEvaluator:
    """The served evaluator when it is `plugin_id` at `version`, else 422 unsupported_evaluator
    (field `/evaluator/plugin_id` or `/evaluator/version`)."""
    served = await served_evaluator(conn, plugin_id)
    if served is None:
        raise ApiError(422, "unsupported_evaluator", f"No evaluator {plugin_id!r} is installed.",
                       field=f"{field_prefix}/plugin_id")
    if served.version != version:
        raise ApiError(422, "unsupported_evaluator", f"Evaluator {plugin_id!r} is installed at version "
                                                     f"{served.version}, not {version}.",
                       field=f"{field_prefix}/version")
    return served
