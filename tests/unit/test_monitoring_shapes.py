"""The pure checks of Saved Query and Subscription requests (decisions-part2 "Monitoring" >
"Saved queries", "Subscriptions"; part 2 rule 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contentsvc.domain.errors import ApiError
from contentsvc.monitoring.shapes import check_against_evaluator, check_corpus_ids, check_expression, check_owner

MANIFEST = json.loads((Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins" / "fixture_evaluator"
                       / "contentsvc-plugin.json").read_text())["contributions"]["subscription"]


def _refusal(call, *args) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args)
    return caught.value


@pytest.mark.parametrize("owner", ["", "x" * 129, "a\x07b", "line\nbreak", "none"])
def test_invalid_owners(owner):
    error = _refusal(check_owner, owner)
    assert (error.status, error.code, error.field) == (422, "invalid_owner", "/owner")


@pytest.mark.parametrize("owner", [None, "u", "x" * 128, "None", "user 17 (é)"])
def test_valid_owners(owner):
    check_owner(owner)


def test_corpus_ids_must_be_unique():
    error = _refusal(check_corpus_ids, ["a", "b", "a"])
    assert (error.code, error.field) == ("invalid_schema", "/corpus_ids")
    check_corpus_ids(["a", "b"])


def test_expression_size_bound():
    check_expression({"contains": "x" * 60_000})
    error = _refusal(check_expression, {"contains": "x" * (64 * 1024)})
    assert (error.code, error.field) == ("invalid_schema", "/expression")


def test_expression_and_configuration_against_the_evaluator_schemas():
    schemas = (MANIFEST["expression_schema"], MANIFEST["configuration_schema"])
    check_against_evaluator(*schemas, {"contains": "crane"}, {"label": "x"})
    error = _refusal(check_against_evaluator, *schemas, {"contains": 7}, {})
    assert (error.code, error.field) == ("invalid_expression", "/saved_query_version_id")
    assert "/contains" in error.message  # the first schema issue, named
    error = _refusal(check_against_evaluator, *schemas, {"contains": "crane"}, {"label": "x" * 65})
    assert (error.code, error.field) == ("invalid_subscription_configuration", "/evaluator/configuration/label")
    error = _refusal(check_against_evaluator, *schemas, {"contains": "crane"}, {"colour": "red"})
    assert error.field == "/evaluator/configuration"  # an unknown member: the issue is the object's
