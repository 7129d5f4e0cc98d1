"""Plan rules (part 2 "Activation rules"; decisions-part2 "Activation, plans, rollback")."""

from contentsvc.plugins.planning import (
    Candidate,
    activation_roles,
    configuration_roles,
    plan_conflicts,
    rollback_roles,
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
