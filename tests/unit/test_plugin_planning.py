"""Plan rules (part 2 "Activation rules"; decisions-part2 "Activation, plans, rollback")."""

from hypothesis import given, settings
from hypothesis import strategies as st

from contentsvc.plugins.planning import (
    Candidate,
    SpaceDefinition,
    activation_roles,
    changed_source_formats,
    configuration_roles,
    plan_conflicts,
    rollback_roles,
    spaces_served,
    transition_conflicts,
)

PDF_1 = Candidate("preg_1", "pdf", "0.1.0", ("normalizer:application/pdf",))
PDF_2 = Candidate("preg_2", "pdf", "0.2.0", ("normalizer:application/pdf",))
OFFICE = Candidate("preg_3", "office", "1.0.0", ("normalizer:application/msword", "normalizer:application/pdf"))
EVALUATOR = Candidate("preg_4", "query", "1.0.0", ("subscription:query",))
ALL = {c.registration_id: c for c in (PDF_1, PDF_2, OFFICE, EVALUATOR)}


def test_another_version_of_the_same_plugin_leaves_the_plan():
    # part 2: every other version of the same plugin leaves the plan
    active = {"normalizer:application/pdf": "preg_1", "subscription:query": "preg_4"}
    roles = activation_roles(active, ALL, PDF_2)
    assert roles == {"normalizer:application/pdf": "preg_2", "subscription:query": "preg_4"}
    assert plan_conflicts(roles, ALL) == []


def test_a_registration_fully_taken_over_leaves_and_a_partial_takeover_is_a_conflict():
    # part 2: a registration whose roles it fully takes over leaves; one normalizer per media type
    assert activation_roles({"normalizer:application/pdf": "preg_1"}, ALL, OFFICE) == {
        "normalizer:application/msword": "preg_3", "normalizer:application/pdf": "preg_3"}
    roles = activation_roles({"normalizer:application/msword": "preg_3", "normalizer:application/pdf": "preg_3"},
                             ALL, PDF_1)
    [conflict] = plan_conflicts(roles, ALL)
    assert conflict.startswith("one normalizer per media type: normalizer:application/pdf")


def test_rollback_keeps_the_configuration_subscription_roles():
    # decisions-part2: activation and rollback never change subscription roles
    assert rollback_roles({"normalizer:application/pdf": "preg_2", "subscription:query": "preg_4"},
                          {"normalizer:application/pdf": "preg_1"}) == {
        "normalizer:application/pdf": "preg_1", "subscription:query": "preg_4"}


def test_configuration_applies_changed_pins_and_keeps_operator_activations():
    # decisions-part2: roles activated since are kept unless the configuration now pins the role elsewhere
    active = {"normalizer:application/pdf": "preg_2", "subscription:query": "preg_4"}
    assert configuration_roles(active, {"normalizer:application/pdf": "preg_1", "subscription:query": "preg_4"},
                               {"normalizer:application/pdf": "preg_1", "subscription:query": "preg_4"}) == active
    assert configuration_roles(active, {"subscription:query": "preg_4"}, {}) == {
        "normalizer:application/pdf": "preg_2"}
    assert configuration_roles({}, {}, {"normalizer:application/pdf": "preg_1"}) == {
        "normalizer:application/pdf": "preg_1"}


# ---------------------------------------------------------------- ingestion and retrieval

MINILM = SpaceDefinition("minilm", "sentence-transformers/all-MiniLM-L6-v2", 384, "cosine")
E5 = SpaceDefinition("minilm", "intfloat/e5-small", 384, "cosine")  # same name, another model
E5_NEW = SpaceDefinition("e5", "intfloat/e5-small", 384, "cosine")  # the new space version: a new name


def ingestion(rid: str, plugin_id: str, version: str, spaces: tuple[SpaceDefinition, ...],
              formats: tuple[str, ...] = ("text/plain",)) -> Candidate:
    return Candidate(rid, plugin_id, version, tuple(f"ingestion:{s.name}" for s in spaces), (), spaces, formats)


def retrieval(rid: str, plugin_id: str, version: str, *profiles: str) -> Candidate:
    return Candidate(rid, plugin_id, version, tuple(f"retrieval:{p}" for p in profiles))


def test_a_space_cannot_change_its_model_without_a_new_space_version():
    # part 2 "Activation rules": vector-space ownership (a model cannot change without a new space version)
    old, new = ingestion("preg_a", "embedder", "1.0.0", (MINILM,)), ingestion("preg_b", "embedder", "2.0.0", (E5,))
    candidates = {c.registration_id: c for c in (old, new)}
    active = {"ingestion:minilm": "preg_a"}
    roles = activation_roles(active, candidates, new)
    assert roles == {"ingestion:minilm": "preg_b"} and plan_conflicts(roles, candidates) == []
    [conflict] = transition_conflicts(active, roles, candidates, activation=True)
    assert conflict.startswith("vector-space ownership: space minilm") and "intfloat/e5-small" in conflict
    # the same model under the same name (a rebuilt plugin) is no change; a new name is a new space version
    same = ingestion("preg_c", "embedder", "1.0.1", (MINILM,))
    versioned = ingestion("preg_d", "embedder", "2.0.0", (E5_NEW,))
    candidates.update({c.registration_id: c for c in (same, versioned)})
    for target in (same, versioned):
        assert transition_conflicts(active, activation_roles(active, candidates, target), candidates,
                                    activation=True) == []


def test_the_engine_space_keeps_its_model():
    # part 1 "Corpus vector space": the owner is the engine or an ingestion plugin
    claimer = ingestion("preg_a", "embedder", "1.0.0", (E5,))
    roles = activation_roles({}, {"preg_a": claimer}, claimer)
    candidates = {"preg_a": claimer}
    assert transition_conflicts({}, roles, candidates, activation=True,
                                known_spaces=spaces_served([], candidates, (MINILM,)))
    assert transition_conflicts({}, roles, candidates, activation=True,
                                known_spaces=spaces_served([], candidates, (E5_NEW,))) == []


def test_a_space_a_plan_left_keeps_its_model():
    # part 2: vector-space ownership; the vectors of a space stay stored after its plugin left the plan
    old, new = ingestion("preg_a", "embedder", "1.0.0", (MINILM,)), ingestion("preg_b", "other", "1.0.0", (E5,))
    candidates = {c.registration_id: c for c in (old, new)}
    history = [{"ingestion:minilm": "preg_a"}, {}]
    [conflict] = transition_conflicts({}, {"ingestion:minilm": "preg_b"}, candidates, activation=True,
                                      known_spaces=spaces_served(history, candidates))
    assert "embedder 1.0.0 (preg_a)" in conflict


def test_one_ingestion_plugin_per_source_format():
    # part 2: valid ingestion source routes (decisions-part2 `source_formats`)
    first = ingestion("preg_a", "embedder", "1.0.0", (MINILM,), ("text/plain", "text/html"))
    second = ingestion("preg_b", "other", "1.0.0", (E5_NEW,), ("text/html",))
    candidates = {c.registration_id: c for c in (first, second)}
    roles = activation_roles({"ingestion:minilm": "preg_a"}, candidates, second)
    [conflict] = plan_conflicts(roles, candidates)
    assert conflict.startswith("valid ingestion source routes") and "text/html" in conflict


def test_an_activation_replaces_only_the_retrieval_provider_of_its_plugin_id():
    # part 2: an activation replaces only the retrieval provider with the same plugin id
    ranker_1, ranker_2 = retrieval("preg_a", "ranker", "1.0.0", "editorial"), retrieval("preg_b", "ranker", "2.0.0",
                                                                                       "editorial")
    rival = retrieval("preg_c", "rival", "1.0.0", "editorial")
    candidates = {c.registration_id: c for c in (ranker_1, ranker_2, rival)}
    active = {"retrieval:editorial": "preg_a"}
    assert transition_conflicts(active, activation_roles(active, candidates, ranker_2), candidates,
                                activation=True) == []
    [conflict] = transition_conflicts(active, activation_roles(active, candidates, rival), candidates,
                                      activation=True)
    assert conflict.startswith("retrieval providers per plugin id: retrieval:editorial")
    # a rollback returns to roles an earlier plan had: not an activation
    assert transition_conflicts(active, {"retrieval:editorial": "preg_c"}, candidates, activation=False) == []


def test_changed_source_formats_are_those_whose_ingestion_plugin_id_changes():
    # part 2: changing the ingestion plugin serving a source format requires complete coverage
    first = ingestion("preg_a", "embedder", "1.0.0", (MINILM,), ("text/plain",))
    upgrade = ingestion("preg_b", "embedder", "1.1.0", (MINILM,), ("text/plain",))
    other = ingestion("preg_c", "other", "1.0.0", (MINILM,), ("text/plain", "text/html"))
    candidates = {c.registration_id: c for c in (first, upgrade, other)}
    active = {"ingestion:minilm": "preg_a"}
    assert changed_source_formats(active, activation_roles(active, candidates, upgrade), candidates) == []
    assert changed_source_formats(active, activation_roles(active, candidates, other), candidates) == [
        "text/html", "text/plain"]
    assert changed_source_formats({}, {"ingestion:minilm": "preg_a"}, candidates) == ["text/plain"]


# ---------------------------------------------------------------- properties

MEDIA_TYPES = st.sampled_from(["application/pdf", "text/html", "application/msword", "image/png"])
SPACES = st.builds(SpaceDefinition, st.sampled_from(["s1", "s2"]), st.sampled_from(["m1", "m2"]),
                   st.sampled_from([8, 16]), st.sampled_from(["cosine", "dot"]))


@st.composite
def registries(draw) -> dict[str, Candidate]:
    """A few registrations of a few plugins, each declaring normalizer routes, spaces, formats and profiles."""
    found: dict[str, Candidate] = {}
    for n in range(draw(st.integers(1, 6))):
        plugin_id = draw(st.sampled_from(["p", "q", "r"]))
        spaces = tuple({s.name: s for s in draw(st.lists(SPACES, max_size=2))}.values())
        roles = [f"normalizer:{m}" for m in draw(st.sets(MEDIA_TYPES, max_size=2))]
        roles += [f"ingestion:{s.name}" for s in spaces]
        roles += [f"retrieval:{p}" for p in draw(st.sets(st.sampled_from(["editorial", "news"]), max_size=1))]
        formats = tuple(draw(st.sets(st.sampled_from(["text/plain", "text/html"]), max_size=2))) if spaces else ()
        rid = f"preg_{n}"
        found[rid] = Candidate(rid, plugin_id, f"1.0.{n}", tuple(sorted(roles)), (), spaces, formats)
    return found


@settings(max_examples=200, deadline=None)
@given(registries(), st.data())
def test_a_plan_that_passes_the_rules_keeps_every_startup_rule(candidates, data):
    # part 2 "Activation rules": the new plan keeps the startup rules, checked over any sequence of activations
    active: dict[str, str] = {}
    for rid in data.draw(st.lists(st.sampled_from(sorted(candidates)), max_size=6)):
        roles = activation_roles(active, candidates, candidates[rid])
        refused = plan_conflicts(roles, candidates) + transition_conflicts(active, roles, candidates, activation=True)
        if refused:
            continue  # refusal leaves the plan unchanged
        active = roles
        members = {candidates[r] for r in active.values()}
        # each member serves every role it declares
        assert all(active[role] == m.registration_id for m in members for role in m.roles)
        # one plugin per source format, and one version per plugin id
        formats = [f for m in members if any(r.startswith("ingestion:") for r in m.roles) for f in m.source_formats]
        assert len(formats) == len(set(formats))
        assert len({m.plugin_id for m in members}) == len(members)


@settings(max_examples=200, deadline=None)
@given(registries(), st.data())
def test_a_space_keeps_its_definition_across_accepted_activations(candidates, data):
    # part 2 "Activation rules": vector-space ownership, whatever the order of activations
    active: dict[str, str] = {}
    history: list[dict[str, str]] = []
    first_seen: dict[str, SpaceDefinition] = {}
    for rid in data.draw(st.lists(st.sampled_from(sorted(candidates)), max_size=6)):
        roles = activation_roles(active, candidates, candidates[rid])
        if plan_conflicts(roles, candidates) or transition_conflicts(
                active, roles, candidates, activation=True, known_spaces=spaces_served(history, candidates)):
            continue
        active = roles
        history.append(roles)
        for role, holder in active.items():
            if role.startswith("ingestion:"):
                definition = candidates[holder].space(role.split(":", 1)[1])
                assert first_seen.setdefault(definition.name, definition) == definition
