"""Which registration serves each role in a new plan (decisions-part2 "Activation, plans,
rollback"; part 2 "Activation rules"), and what in a plan breaks the startup rules. Pure.

A plan maps each role (`normalizer:<media type>`, `connector:<kind>`, `subscription:<id>`,
`ingestion:<space>`, `retrieval:<profile>`) to one registration, so "one normalizer per media
type" and "one provider per connector kind" hold by construction of the map; what can break
them is a registration left in the plan that still declares a role another now serves (it
would serve every role it declares, part 2). Those, and two registrations declaring the same
extension namespace, are the conflicts listed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUBSCRIPTION = "subscription"


@dataclass(frozen=True)
class Candidate:
    """What the rules need to know of a registration."""

    registration_id: str
    plugin_id: str
    version: str
    roles: tuple[str, ...]
    extension_namespaces: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.plugin_id} {self.version} ({self.registration_id})"


def role_kind(role: str) -> str:
    return role.split(":", 1)[0]


def activation_roles(active: dict[str, str], candidates: dict[str, Candidate], target: Candidate) -> dict[str, str]:
    """The roles of the plan an activation of `target` makes: it serves every role it declares;
    every other version of the same plugin leaves, and so does any registration whose roles it
    fully takes over (it then holds none). Subscription roles stay the configuration's."""
    roles = {role: rid for role, rid in active.items()
             if rid == target.registration_id or role_kind(role) == SUBSCRIPTION
             or candidates[rid].plugin_id != target.plugin_id}
    for role in target.roles:
        if role_kind(role) != SUBSCRIPTION:
            roles[role] = target.registration_id
    return dict(sorted(roles.items()))


def rollback_roles(active: dict[str, str], target_plan: dict[str, str]) -> dict[str, str]:
    """The roles of the plan a rollback to `target_plan` makes: its roles, except that the
    subscription roles stay the active plan's (the configuration's)."""
    roles = {role: rid for role, rid in target_plan.items() if role_kind(role) != SUBSCRIPTION}
    roles.update({role: rid for role, rid in active.items() if role_kind(role) == SUBSCRIPTION})
    return dict(sorted(roles.items()))


def configuration_roles(active: dict[str, str], last_pins: dict[str, str], pins: dict[str, str]) -> dict[str, str]:
    """The roles of a configuration plan: the active plan's, with each role whose pin changed since
    the last configuration plan set to its pinned registration, and roles the file no longer pins
    dropped when they are still served by what the file pinned before. Roles the operator
    activated since are kept unless the file now pins that role to another registration."""
    roles = dict(active)
    for role, rid in last_pins.items():
        if role not in pins and roles.get(role) == rid:
            del roles[role]
    for role, rid in pins.items():
        if last_pins.get(role) != rid:
            roles[role] = rid
    return dict(sorted(roles.items()))


def plan_conflicts(roles: dict[str, str], candidates: dict[str, Candidate]) -> list[str]:
    """Each startup rule the plan breaks, one sentence per break, in role order."""
    breaks: list[str] = []
    members = sorted(set(roles.values()))
    for rid in members:
        member = candidates[rid]
        for role in member.roles:
            holder = roles.get(role)
            if holder is not None and holder != rid:
                rule = {"normalizer": "one normalizer per media type", "connector": "one provider per connector kind",
                        "ingestion": "one provider per ingestion space", "retrieval": "one retrieval provider per "
                        "profile", SUBSCRIPTION: "one evaluator per plugin id"}.get(role_kind(role), "one provider "
                                                                                                        "per role")
                breaks.append(f"{rule}: {role} would be served by {candidates[holder].label} while "
                              f"{member.label}, which declares it, stays in the plan")
    namespaces: dict[str, str] = {}
    for rid in members:
        for namespace in candidates[rid].extension_namespaces:
            if namespace in namespaces and namespaces[namespace] != rid:
                breaks.append(f"extension namespaces: {namespace} is declared by both "
                              f"{candidates[namespaces[namespace]].label} and {candidates[rid].label}")
            namespaces.setdefault(namespace, rid)
    return sorted(set(breaks), key=breaks.index)
