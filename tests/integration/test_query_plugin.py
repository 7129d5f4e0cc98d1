"""The first-party `query` subscription evaluator as a real process (decisions-part2, "Plugin
processes and first-party plugins": `query`)."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.first_party_checks import failures, plugin_check
from tests.integration.plugin_processes import PLUGINS, PluginProcess

PARTS = [
    {"key": "title", "role": "title", "text": "Harbour report"},
    {"key": "body", "role": "body", "text": "The cranes were inspected on Monday; two need new bearings."},
    {"key": "note", "role": "note", "text": "Bearings ordered from the usual supplier."},
]


@pytest.fixture(scope="module")
def query_plugin(tmp_path_factory):
    plugin = PluginProcess("query", tmp_path_factory.mktemp("query"))
    yield plugin
    plugin.stop()


def evaluate(plugin: PluginProcess, *expressions: dict, parts: list[dict] = PARTS,
             configuration: dict | None = None) -> httpx.Response:
    record = {"corpus_id": "c1", "record_id": "r1", "record_version_id": "v1", "enriched": False, "parts": parts,
              "source": {"namespace": "n", "record_key": "k", "position": "1"},
              "accepted_at": "2026-01-01T00:00:00Z", "provenance": {"origin": "client"}, "extensions": {}}
    evaluations = [{"id": f"e{n + 1}", "expression": expression, "configuration": configuration or {},
                    "subscriptions": []} for n, expression in enumerate(expressions)]
    return httpx.post(f"{plugin.base_url}/v0/contributions/subscription", timeout=30,
                      json={"invocation_id": "inv1", "idempotency_key": "k1", "contribution": "subscription",
                            "organization_id": "org", "record": record, "evaluations": evaluations,
                            "configuration": {}})


def test_and_is_the_default_operator_and_or_widens_it(query_plugin):
    # decisions-part2 query: match iff the whole-Version document matches, default_operator AND by default
    answer = evaluate(query_plugin, {"query": "crane supplier"}, {"query": "crane submarine"},
                      {"query": "crane submarine", "default_operator": "OR"})
    assert answer.status_code == 200
    decisions = {d["id"]: d for d in answer.json()["decisions"]}
    # the terms sit in two Parts: the whole-Version document holds both, stemmed by the core analyzer
    assert decisions["e1"]["decision"] == "match"
    assert decisions["e2"] == {"id": "e2", "decision": "no_match"}
    assert decisions["e3"]["decision"] == "match"
    assert decisions["e3"]["evidence"]["part_keys"] == ["body"]


def test_evidence_names_parts_matching_any_term_in_manifest_order(query_plugin):
    # decisions-part2 query: part_keys = selected Parts matching the OR of the terms, manifest order;
    # explanation `query matched N part(s)`; details {score, snippet} of the first matching Part
    decision = evaluate(query_plugin, {"query": "bearings harbour"}).json()["decisions"][0]
    assert decision["decision"] == "match"
    evidence = decision["evidence"]
    assert evidence["part_keys"] == ["title", "body", "note"]
    assert evidence["explanation"] == "query matched 3 part(s)"
    assert evidence["details"]["score"] > 0
    assert evidence["details"]["snippet"] == {"part_key": "title", "text": "Harbour report", "start": 0, "end": 14}


def test_snippet_offsets_are_code_points_within_snippet_chars(query_plugin):
    # decisions-part2 query: snippet start/end are code-point offsets; configuration snippet_chars 40..1000
    text = "Ünïcödé prelude — " * 6 + "the dredger Ævar arrived at the quay after midnight " + "ß" * 80
    decision = evaluate(query_plugin, {"query": "dredger"}, parts=[{"key": "p", "role": "body", "text": text}],
                        configuration={"snippet_chars": 40}).json()["decisions"][0]
    snippet = decision["evidence"]["details"]["snippet"]
    assert snippet["text"] == text[snippet["start"]:snippet["end"]]
    assert "dredger" in snippet["text"]
    assert snippet["end"] - snippet["start"] <= 40


def test_roles_and_part_keys_select_parts_and_no_selected_part_is_no_match(query_plugin):
    # decisions-part2 query: roles?/part_keys? filters; no selected Part = no_match
    answer = evaluate(query_plugin, {"query": "bearings", "roles": ["note"]},
                      {"query": "harbour", "roles": ["body", "note"]},
                      {"query": "bearings", "part_keys": ["body"]},
                      {"query": "bearings", "roles": ["appendix"]}).json()["decisions"]
    assert answer[0]["decision"] == "match" and answer[0]["evidence"]["part_keys"] == ["note"]
    assert answer[1]["decision"] == "no_match"
    assert answer[2]["evidence"]["part_keys"] == ["body"]
    assert answer[3]["decision"] == "no_match"


def test_tantivy_syntax_phrases_and_exclusions(query_plugin):
    # decisions-part2 query: the expression is Tantivy query syntax
    answer = evaluate(query_plugin, {"query": '"harbour report"'}, {"query": '"report harbour"'},
                      {"query": "bearings -supplier"}).json()["decisions"]
    assert answer[0]["decision"] == "match"
    assert answer[1]["decision"] == "no_match"
    assert answer[2]["decision"] == "no_match"  # the whole Version holds the excluded word


def test_an_unparsable_query_is_a_terminal_invalid_expression(query_plugin):
    # decisions-part2 query: unparsable query is error envelope invalid_expression, retryable false
    answer = evaluate(query_plugin, {"query": "title:(harbour"})
    assert answer.status_code == 422
    assert answer.json()["code"] == "invalid_expression" and answer.json()["retryable"] is False
    # an expression outside the expression schema is refused the same way
    answer = evaluate(query_plugin, {"query": "harbour", "fuzzy": True})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_expression"


def test_never_not_ready(query_plugin):
    # decisions-part2 query: never not_ready, whether or not the record is enriched
    decisions = evaluate(query_plugin, *({"query": q} for q in ("harbour", "absent", "bearings OR absent")))
    assert {d["decision"] for d in decisions.json()["decisions"]} <= {"match", "no_match"}


def test_contract_check_certifies_the_shipped_fixtures(query_plugin):
    # decisions-part2 "Contract check": the plugin's own fixtures, through `contentsvc plugin check`
    code, report = plugin_check(PLUGINS / "query", query_plugin.base_url)
    assert code == 0, failures(report)
    assert report["certified"] is True and report["skipped"] == 0
    assert any(check["id"] == "subscription.fixture" for check in report["checks"])
