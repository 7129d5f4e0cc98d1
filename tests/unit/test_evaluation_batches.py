"""The monitor's pure grouping, batching and answer checks (monitoring/batches.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contentsvc.monitoring.batches import (
    InvalidOutput,
    Pending,
    check_answer,
    fingerprint,
    idempotency_key,
    plan_batches,
)

words = st.sampled_from(["crane", "harbour", "ship", "dock", "tide"])
pendings = st.lists(
    st.builds(lambda n, word, label: Pending(f"sub_{n}", f"subv_{n}", "sq_1", "sqv_1", None, {"contains": word},
                                             {"label": label} if label else {}),
              st.integers(0, 10_000), words, st.sampled_from([None, "a", "b"])),
    min_size=1, max_size=40, unique_by=lambda p: p.subscription_version_id)


@given(pendings, st.integers(1, 8))
def test_identical_pairs_are_one_evaluation_and_batches_respect_the_size(pending, size):
    # decisions-part2 "Evaluation trigger and eligibility": deduplicate identical (expression,
    # configuration), split at max_batch_size; part 2: never more evaluations than max_batch_size.
    batches = plan_batches("ver_1", pending, size)
    distinct = {fingerprint(p.expression, p.configuration) for p in pending}
    sent = [fingerprint(e["expression"], e["configuration"]) for b in batches for e in b.evaluations]
    assert sorted(sent) == sorted(distinct)  # each distinct pair exactly once
    assert all(1 <= len(b.evaluations) <= size for b in batches)
    # every pending evaluation is answered by exactly one evaluation id of one batch
    members = [p.subscription_version_id for b in batches for subs in b.members.values() for p in subs]
    assert sorted(members) == sorted(p.subscription_version_id for p in pending)


@given(pendings, st.integers(1, 8))
def test_fingerprints_known_beforehand_plan_the_same_requests(pending, size):
    # decisions-part2 "Evaluation trigger and eligibility": the monitor passes the fingerprints it
    # computed once per Subscription Version; the requests must be those computed from scratch.
    known = {p.subscription_version_id: fingerprint(p.expression, p.configuration) for p in pending[::2]}
    assert plan_batches("ver_1", pending, size, known) == plan_batches("ver_1", pending, size)


@given(pendings, st.integers(1, 8))
def test_ids_are_e1_to_en_in_request_order(pending, size):
    # decisions-part2: evaluations[].id = e1, e2 ... in request order
    for b in plan_batches("ver_1", pending, size):
        assert [e["id"] for e in b.evaluations] == [f"e{n}" for n in range(1, len(b.evaluations) + 1)]
        assert set(b.members) == {e["id"] for e in b.evaluations}


@given(pendings, st.integers(1, 8), st.randoms())
def test_the_idempotency_key_is_stable_across_order_and_retries(pending, size, rnd):
    # decisions-part2: idempotency_key = sha256 of record_version_id and the sorted fingerprints;
    # part 2: the same key gives the same decisions, so a retry sends the same key.
    shuffled = list(pending)
    rnd.shuffle(shuffled)
    first = plan_batches("ver_1", pending, size)
    again = plan_batches("ver_1", shuffled, size)
    assert [b.idempotency_key for b in first] == [b.idempotency_key for b in again]
    assert [b.evaluations for b in first] == [b.evaluations for b in again]
    other = plan_batches("ver_2", pending, size)
    assert {b.idempotency_key for b in first}.isdisjoint(b.idempotency_key for b in other)


def test_the_key_is_sha256_of_the_version_and_sorted_fingerprints():
    a, b = fingerprint({"contains": "a"}, {}), fingerprint({"contains": "b"}, {})
    assert idempotency_key("ver_1", [a, b]) == idempotency_key("ver_1", [b, a])
    assert len(idempotency_key("ver_1", [a])) == 64


def test_fingerprints_ignore_member_order():
    assert fingerprint({"a": 1, "b": 2}, {"x": 1}) == fingerprint({"b": 2, "a": 1}, {"x": 1})


PARTS = {"title", "body"}


def test_a_valid_answer_gives_the_decisions_by_id():
    answer = {"decisions": [{"id": "e1", "decision": "match", "evidence": {"explanation": "x", "part_keys": ["body"]}},
                            {"id": "e2", "decision": "no_match"}]}
    got = check_answer(answer, ["e1", "e2"], PARTS)
    assert got["e1"] == {"decision": "match", "evidence": {"explanation": "x", "part_keys": ["body"], "details": {}}}
    assert got["e2"] == {"decision": "no_match"}


@pytest.mark.parametrize("answer", [
    {},  # no decisions
    {"decisions": [{"id": "e1", "decision": "match"}]},  # part 2: evidence is required for match
    {"decisions": [{"id": "e1", "decision": "match", "evidence": {"explanation": "x", "part_keys": ["nope"]}}]},
    {"decisions": [{"id": "e9", "decision": "no_match"}]},  # unknown id
    {"decisions": []},  # missing id
    {"decisions": [{"id": "e1", "decision": "no_match"}, {"id": "e1", "decision": "no_match"}]},  # repeated
    {"decisions": [{"id": "e1", "decision": "maybe"}]},
    {"decisions": [{"id": "e1", "decision": "match", "evidence": {"explanation": ""}}]},
    {"decisions": [{"id": "e1", "decision": "match",
                    "evidence": {"explanation": "x", "details": {"big": "y" * 17000}}}]},  # oversize
])
def test_invalid_answers_are_refused(answer):
    # decisions-part2: invalid output (match without evidence, unknown part_keys, unknown or
    # missing id, oversize) records no Match: evaluator_invalid_output
    with pytest.raises(InvalidOutput):
        check_answer(answer, ["e1"], PARTS)
