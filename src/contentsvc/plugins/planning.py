"""Which registration serves each role in a new plan (decisions-part2 "Activation, plans,
rollback"; part 2 "Activation rules"), and what in a plan breaks the startup rules. Pure.

A plan maps each role (`normalizer:<media type>`, `connector:<kind>`, `subscription:<id>`,
`ingestion:<space>`, `retrieval:<profile>`) to one registration, so "one normalizer per media
type" and "one provider per connector kind" hold by construction of the map; what can break
them is a registration left in the plan that still declares a role another now serves (it
would serve every role it declares, part 2). The startup rules are checked by one function,
`declaration_conflicts`, over the registrations a plan holds or the plugins a startup
configuration pins (config/plugins.py): one provider per role, one declarer per extension
namespace, one ingestion plugin per source format. What a plan may not change from the active
one is checked by `transition_conflicts`: vector-space ownership (a space keeps its model,
dimensions and metric) and, for an activation, retrieval providers per plugin id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SUBSCRIPTION = "subscription"


@dataclass(frozen=True)
class SpaceDefinition:
    """What identifies the vectors of a space (decisions-part2 "Manifest file": `spaces [{name,
    model, dimensions, metric, modalities}]`). The manifest has no space version member, so a new
    space version is a new space name (docs/decisions.md)."""

    name: str
    model: str
    dimensions: int
    metric: str

    def describe(self) -> str:
        return f"model {self.model}, {self.dimensions} dimensions, metric {self.metric}"


@dataclass(frozen=True)
class Candidate:
    """What the rules need to know of a registration."""

    registration_id: str
    plugin_id: str
    version: str
    roles: tuple[str, ...]
    extension_namespaces: tuple[str, ...] = field(default=())
    spaces: tuple[SpaceDefinition, ...] = field(default=())  # the manifest's ingestion spaces
    source_formats: tuple[str, ...] = field(default=())  # the manifest's ingestion source formats

    def space(self, name: str) -> SpaceDefinition | None:
        return next((s for s in self.spaces if s.name == name), None)

    @property
    def label(self) -> str:
        return f"{self.plugin_id} {self.version} ({self.registration_id})"


def planning_spaces(manifest) -> tuple[SpaceDefinition, ...]:
    """The space definitions of a manifest's ingestion contribution (plugins/manifest.py Manifest)."""
    ingestion = manifest.contributions.ingestion
    return tuple(SpaceDefinition(s.name, s.model, s.dimensions, s.metric) for s in ingestion.spaces) \
        if ingestion else ()


def candidate_of(member_id: str, manifest, roles: list[str]) -> Candidate:
    """What the rules need of a registration or a pinned plugin: its roles and what its manifest
    declares (extension namespaces, ingestion spaces and source formats)."""
    normalizer = manifest.contributions.normalizer
    ingestion = manifest.contributions.ingestion
    return Candidate(member_id, manifest.id, manifest.version, tuple(roles),
                     tuple(d.namespace for d in normalizer.extensions) if normalizer else (),
                     planning_spaces(manifest), tuple(ingestion.source_formats) if ingestion else ())


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


@dataclass(frozen=True)
class Conflict:
    """One break of a startup rule: `member` (a registration id, or a plugin id at startup) declares
    `what` in its `setting` (routes, kinds, spaces, profiles, extensions, source_formats) while
    `other` already does."""

    rule: str
    member: str
    setting: str
    what: str
    other: str


_ROLE_RULES = {
    "normalizer": ("one normalizer per media type", "routes"),
    "connector": ("one provider per connector kind", "kinds"),
    "ingestion": ("vector-space ownership (one ingestion plugin per space)", "spaces"),
    "retrieval": ("retrieval providers per plugin id (one provider per retrieval profile)", "profiles"),
    SUBSCRIPTION: ("one evaluator per plugin id", "id"),
}


def declaration_conflicts(members: list[Candidate]) -> list[Conflict]:
    """The startup rules over the registrations of one plan (or the plugins one configuration
    pins), each of which serves every role it declares (part 2 "Activation rules"): one provider
    per role, one declarer per extension namespace, one ingestion plugin per source format. The
    earlier member keeps what it declares; each later one declaring it again is a break."""
    breaks: list[Conflict] = []
    claims: dict[tuple[str, str], str] = {}  # (setting, what) -> first member

    def claim(member: Candidate, rule: str, setting: str, what: str) -> None:
        holder = claims.setdefault((setting, what), member.registration_id)
        if holder != member.registration_id:
            breaks.append(Conflict(rule, member.registration_id, setting, what, holder))

    for member in members:
        for role in member.roles:
            rule, setting = _ROLE_RULES.get(role_kind(role), ("one provider per role", "roles"))
            claim(member, rule, setting, role)
        for namespace in member.extension_namespaces:
            claim(member, "extension namespaces", "extensions", namespace)
        if any(role_kind(role) == "ingestion" for role in member.roles):
            for media_type in member.source_formats:
                claim(member, "valid ingestion source routes (one ingestion plugin per source format)",
                      "source_formats", f"source format {media_type}")
    return breaks


def plan_conflicts(roles: dict[str, str], candidates: dict[str, Candidate]) -> list[str]:
    """Each startup rule the plan breaks, one sentence per break, in registration order."""
    members = [candidates[rid] for rid in sorted(set(roles.values()))]
    return _sentences([_plan_sentence(c, candidates) for c in declaration_conflicts(members)])


def _plan_sentence(conflict: Conflict, candidates: dict[str, Candidate]) -> str:
    return (f"{conflict.rule}: {conflict.what} is declared by both {candidates[conflict.other].label} and "
            f"{candidates[conflict.member].label}, which would both stay in the plan")


def served_spaces(roles: dict[str, str], candidates: dict[str, Candidate]) -> dict[str, tuple[Candidate, SpaceDefinition]]:
    """space name -> (its provider, its definition) for each `ingestion:<space>` role of a plan."""
    served = {}
    for role, rid in roles.items():
        if role_kind(role) == "ingestion":
            name = role.split(":", 1)[1]
            definition = candidates[rid].space(name)
            if definition is not None:
                served[name] = (candidates[rid], definition)
    return served


def spaces_served(plans: list[dict[str, str]], candidates: dict[str, Candidate],
                  engine_spaces: tuple[SpaceDefinition, ...] = ()) -> dict[str, tuple[str, SpaceDefinition]]:
    """space name -> (its owner, its definition) for every space the engine owns or a plan ever
    served (plans oldest first): its vectors stay stored under that name after the plan is left,
    so the first definition a name had is the one it keeps."""
    known = {s.name: ("the engine", s) for s in engine_spaces}
    for roles in plans:
        for name, (provider, definition) in served_spaces(roles, candidates).items():
            known.setdefault(name, (provider.label, definition))
    return known


def transition_conflicts(active: dict[str, str], roles: dict[str, str], candidates: dict[str, Candidate], *,
                         activation: bool, known_spaces: dict[str, tuple[str, SpaceDefinition]] | None = None
                         ) -> list[str]:
    """What a new plan may not change (part 2 "Activation rules"):

    - vector-space ownership: a space keeps the model, dimensions and metric its vectors were
      made with (`known_spaces`, see spaces_served; the active plan's spaces when not given),
      whether the engine owns it or an ingestion plugin serves or served it ("a model cannot
      change without a new space version", a new space name);
    - for an activation, retrieval providers per plugin id: "an activation replaces only the
      retrieval provider with the same plugin id", so a profile served by another plugin stays
      that plugin's (a rollback returns to roles an earlier plan already had)."""
    breaks: list[str] = []
    before = known_spaces if known_spaces is not None else spaces_served([active], candidates)
    for name, (provider, definition) in sorted(served_spaces(roles, candidates).items()):
        if name in before and _identity(before[name][1]) != _identity(definition):
            owner, held = before[name]
            breaks.append(f"vector-space ownership: space {name} holds vectors of {held.describe()} ({owner}); "
                          f"{provider.label} declares {definition.describe()}: a model cannot change without a new "
                          "space version (declare the space under a new name)")
    if activation:
        for role, rid in sorted(roles.items()):
            held = active.get(role)
            if role_kind(role) == "retrieval" and held is not None and \
                    candidates[held].plugin_id != candidates[rid].plugin_id:
                breaks.append(f"retrieval providers per plugin id: {role} is served by {candidates[held].label}; "
                              f"an activation replaces only the retrieval provider with the same plugin id, not "
                              f"{candidates[rid].label}'s")
    return _sentences(breaks)


def _identity(space: SpaceDefinition) -> tuple[str, int, str]:
    return space.model, space.dimensions, space.metric


def source_format_providers(roles: dict[str, str], candidates: dict[str, Candidate]) -> dict[str, str]:
    """source format -> plugin id of the ingestion plugin serving it in a plan: a registration with
    an `ingestion:<space>` role serves the source formats its manifest declares."""
    providers: dict[str, str] = {}
    for rid in sorted(set(roles.values())):
        member = candidates[rid]
        if any(role_kind(role) == "ingestion" and holder == rid for role, holder in roles.items()):
            for media_type in member.source_formats:
                providers.setdefault(media_type, member.plugin_id)
    return providers


def changed_source_formats(active: dict[str, str], roles: dict[str, str],
                           candidates: dict[str, Candidate]) -> list[str]:
    """The source formats whose ingestion plugin (by plugin id) a new plan changes, gained or lost
    included: part 2 requires complete primary-vector coverage of every current Version first."""
    before = source_format_providers(active, candidates)
    after = source_format_providers(roles, candidates)
    return sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))


def _sentences(breaks: list[str]) -> list[str]:
    return sorted(set(breaks), key=breaks.index)
