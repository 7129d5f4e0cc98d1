"""What one attempt at a Version's routed Blob Parts decides (projectors/normalizer_calls.settle).

Part 1 "Diagnostic" (the normalization codes and the optional-route paragraph) and part 2 pinned
work. The first-party pdf manifest (retry.max_attempts 3) stands for the plugin."""

from __future__ import annotations

from importlib import resources

from hypothesis import given
from hypothesis import strategies as st

from contentsvc.plugins.client import PluginTarget
from contentsvc.plugins.manifest import installed_settings, parse_manifest
from contentsvc.plugins.plans import Provider
from contentsvc.projectors.normalizer_calls import (
    Answered,
    NotNow,
    Pin,
    Publish,
    Quarantine,
    Refused,
    RoutedPart,
    Wait,
    settle,
)

PINNED = parse_manifest(resources.files("contentsvc_plugins.pdf").joinpath("contentsvc-plugin.json").read_bytes())
PROVIDER = Provider("reg_1", "pdf", "0.1.0", PluginTarget("pdf", "0.1.0", "d" * 64, "http://127.0.0.1:9"),
                    PINNED.manifest, installed_settings(PINNED.manifest, None))
BUDGET = 3  # the pdf manifest's retry.max_attempts


def routed(blob_id: str, optional: bool = False) -> RoutedPart:
    return RoutedPart(blob_id, PROVIDER, optional, {"idempotency_key": f"rcp_1:{blob_id}"})


def parts(text: str) -> list[dict]:
    return [{"key": "page-1", "role": "body", "content": {"kind": "text", "text": text}}]


PIN = Pin("plan_1", "reg_1")


def test_answers_publish_the_parts_with_what_the_plugin_said_of_the_version():
    decision = settle(PIN, [routed("blob_a")], [Answered(parts("hello"), "inv_1", {"acme": {"x": 1}}, "en")], {},
                      True, 10)
    assert isinstance(decision, Publish)
    assert decision.parts == {"blob_a": parts("hello")} and decision.listed == []
    assert decision.language == "en" and decision.extensions == {"acme": {"x": 1}}


def test_a_terminal_error_quarantines_naming_plugin_contribution_and_invocation():
    # part1 Diagnostic: normalizer_failed
    decision = settle(PIN, [routed("blob_a")], [Refused("normalizer_failed", "pdf said no", "inv_7")], {}, True, 10)
    assert isinstance(decision, Quarantine)
    assert decision.diagnostic == {"code": "normalizer_failed", "message": "pdf said no", "retryable": False,
                                   "contribution": "normalizer", "plugin": "pdf", "invocation_id": "inv_7"}


def test_retryable_errors_wait_until_the_manifest_budget_is_spent():
    # part1 Diagnostic: normalizer_retries_exhausted after retry.max_attempts
    pin = PIN
    for _ in range(BUDGET - 1):
        decision = settle(pin, [routed("blob_a")], [NotNow("retryable", "busy", "inv")], {}, True, 10)
        assert isinstance(decision, Wait)
        pin = decision.pin
    decision = settle(pin, [routed("blob_a")], [NotNow("retryable", "busy", "inv")], {}, True, 10)
    assert isinstance(decision, Quarantine) and decision.diagnostic["code"] == "normalizer_retries_exhausted"


def test_timeouts_end_in_normalizer_timeout():
    # part1 Diagnostic: normalizer_timeout
    pin = Pin("plan_1", "reg_1", BUDGET - 1, BUDGET - 1)
    decision = settle(pin, [routed("blob_a")], [NotNow("timeout", "slow", "inv")], {}, True, 10)
    assert isinstance(decision, Quarantine) and decision.diagnostic["code"] == "normalizer_timeout"


def test_an_unreachable_plugin_of_the_active_plan_is_waited_for_without_end():
    # part1: an unreachable plugin is retried with backoff and produces no diagnostic
    pin = Pin("plan_1", "reg_1", 500, 0)
    decision = settle(pin, [routed("blob_a")], [NotNow("unreachable", "refused", "inv")], {}, True, 10)
    assert isinstance(decision, Wait) and decision.pin.attempts == 501 and decision.pin.budget_spent == 0


def test_pinned_work_on_a_plan_no_longer_active_stops_after_pinned_plugin_attempts():
    # part2 pinned work: pinned_plugin_unavailable
    pin = Pin("plan_old", "reg_1", 9, 0)
    decision = settle(pin, [routed("blob_a")], [NotNow("unreachable", "refused", "inv")], {}, False, 10)
    assert isinstance(decision, Quarantine) and decision.diagnostic["code"] == "pinned_plugin_unavailable"


def test_an_optional_route_falls_back_to_the_text_path_with_the_code_listed():
    # part1: "On an optional route, every quarantining code that comes from the normalizer instead leaves a
    # searchable Version published through the built-in text path, with the code listed."
    decision = settle(PIN, [routed("blob_a", optional=True)], [Refused("normalizer_invalid_output", "bad", "inv")],
                      {}, True, 10)
    assert isinstance(decision, Publish) and decision.parts == {"blob_a": None}
    assert [d["code"] for d in decision.listed] == ["normalizer_invalid_output"]


def test_input_unverified_is_the_cores_and_quarantines_even_on_an_optional_route():
    decision = settle(PIN, [routed("blob_a", optional=True)], [Refused("input_unverified", "changed", None)], {},
                      True, 10)
    assert isinstance(decision, Quarantine) and decision.diagnostic["code"] == "input_unverified"
    assert "plugin" not in decision.diagnostic


def test_a_later_different_answer_keeps_the_first_recorded_and_lists_normalizer_conflict():
    # part1 Diagnostic: normalizer_conflict; the first recorded output is kept and published
    first = settle(PIN, [routed("blob_a"), routed("blob_b")],
                   [Answered(parts("one"), "inv_1"), NotNow("retryable", "busy", "inv_2")], {}, True, 10)
    assert isinstance(first, Wait) and first.answers["blob_a"]["parts"] == parts("one")
    second = settle(first.pin, [routed("blob_a"), routed("blob_b")],
                    [Answered(parts("two"), "inv_3"), Answered(parts("b"), "inv_4")], first.answers, True, 10)
    assert isinstance(second, Publish)
    assert second.parts == {"blob_a": parts("one"), "blob_b": parts("b")}
    assert [(d["code"], d["invocation_id"]) for d in second.listed] == [("normalizer_conflict", "inv_3")]


OUTCOMES = st.one_of(
    st.builds(Answered, st.sampled_from([parts("a"), parts("b")]), st.just("inv")),
    st.builds(Refused, st.sampled_from(["normalizer_failed", "normalizer_invalid_output", "input_unverified"]),
              st.just("no"), st.just("inv")),
    st.builds(NotNow, st.sampled_from(["retryable", "timeout", "unreachable"]), st.just("later"), st.just("inv")),
)


@given(st.lists(st.tuples(OUTCOMES, st.booleans()), min_size=1, max_size=4),
       st.integers(0, 12), st.integers(0, 4), st.booleans())
def test_every_attempt_ends_in_exactly_one_lawful_decision(cases, attempts, spent, active):
    routes = [routed(f"blob_{i}", optional) for i, (_, optional) in enumerate(cases)]
    outcomes = [outcome for outcome, _ in cases]
    decision = settle(Pin("plan", "reg", attempts, spent), routes, outcomes, {}, active, 10)
    if isinstance(decision, Wait):  # only while some Part has no answer, and it spends an attempt
        assert any(isinstance(o, NotNow) for o in outcomes) and decision.pin.attempts == attempts + 1
    elif isinstance(decision, Quarantine):
        assert decision.diagnostic["code"] in {"normalizer_failed", "normalizer_invalid_output", "input_unverified",
                                               "normalizer_timeout", "normalizer_retries_exhausted",
                                               "pinned_plugin_unavailable"}
    else:  # published: every routed Part has its text, or falls back on an optional route
        assert set(decision.parts) == {r.blob_id for r in routes}
        assert all(r.optional for r in routes if decision.parts[r.blob_id] is None)
