"""`subscription.fixture`: a subscription fixture's record and evaluations sent in batches of the
manifest's max_batch_size, the decisions held to part 2's response rules and the fixture's expect."""

from __future__ import annotations

import hashlib
import json

from contentsvc.ids import new_id
from contentsvc.plugins.client import PluginClient, PluginFailed, PluginUnreachable
from contentsvc.plugins.contract_check.fixtures import Fixture
from contentsvc.plugins.contract_check.report import (
    CHECK_ORGANIZATION,
    Issue,
    Recorder,
    call_issue,
    schema_issues,
)
from contentsvc.plugins.manifest import InstalledSettings, Manifest, pointer

EVALUATOR_TIMEOUT_SECONDS = 10.0  # [monitoring] evaluator_timeout_seconds' default

SUBSCRIPTION_FIXTURE_SCHEMA = {
    "type": "object",
    "required": ["record", "evaluations", "expect"],
    "properties": {
        "record": {"type": "object", "required": ["parts"], "properties": {
            "enriched": {"type": "boolean"},
            "parts": {"type": "array", "maxItems": 256, "items": {
                "type": "object", "required": ["key", "role", "text"], "not": {"required": ["vector"]},
                "properties": {"key": {"type": "string", "minLength": 1}, "role": {"type": "string"},
                               "text": {"type": "string"}}}}}},
        "evaluations": {"type": "array", "minItems": 1, "maxItems": 256, "items": {
            "type": "object", "required": ["expression"],
            "properties": {"configuration": {"type": "object"}}}},
        "expect": {"type": "array", "items": {
            "type": "object", "required": ["id", "decision"], "properties": {
                "id": {"type": "string", "pattern": "^e[1-9][0-9]*$"},
                "decision": {"enum": ["match", "no_match", "not_ready"]}}}},
    },
}

SUBSCRIPTION_RESPONSE_SCHEMA = {
    "type": "object",
    "required": ["decisions"],
    "properties": {"decisions": {"type": "array", "maxItems": 256, "items": {
        "type": "object", "required": ["id", "decision"],
        "properties": {
            "id": {"type": "string", "minLength": 1},
            "decision": {"enum": ["match", "no_match", "not_ready"]},
            "evidence": {"type": "object", "required": ["explanation"], "properties": {
                "explanation": {"type": "string", "minLength": 1, "maxLength": 4096},
                "part_keys": {"type": "array", "maxItems": 100, "items": {"type": "string"}},
                "details": {"type": "object"}}}},
        "if": {"properties": {"decision": {"const": "match"}}},
        "then": {"required": ["evidence"]}}}},
}
MAX_DETAILS_BYTES = 16 * 1024


async def check_subscription_fixture(run: Recorder, client: PluginClient, manifest: Manifest, settings: InstalledSettings,
                                fixture: Fixture) -> None:
    def add(issues: list[Issue]) -> None:
        run.add("subscription.fixture", issues, contribution="subscription", fixture=fixture.path)

    if run.stopped:
        return add([])
    subscription = manifest.contributions.subscription
    if subscription is None:
        return add([Issue("invalid_fixture", "the manifest declares no subscription contribution", "/evaluations")])
    document = fixture.document
    issues = schema_issues(SUBSCRIPTION_FIXTURE_SCHEMA, document, "invalid_fixture")
    for n, evaluation in enumerate(document.get("evaluations", []) if not issues else []):
        issues += schema_issues(subscription.expression_schema, evaluation["expression"], "invalid_fixture",
                                 pointer("evaluations", n, "expression"))
        issues += schema_issues(subscription.configuration_schema, evaluation.get("configuration", {}),
                                 "invalid_fixture", pointer("evaluations", n, "configuration"))
    if issues:
        return add(issues)
    # part 2: evaluations numbered e1, e2 in order; idempotency key derived from the fixture bytes' SHA-256
    evaluations = [{"id": f"e{n}", "expression": e["expression"], "configuration": e.get("configuration", {}),
                    "subscriptions": []} for n, e in enumerate(document["evaluations"], start=1)]
    record = document["record"]
    decisions: dict[str, dict] = {}
    key = "fixture-" + hashlib.sha256(fixture.raw).hexdigest()
    size = subscription.max_batch_size
    for start in range(0, len(evaluations), size):  # never more than max_batch_size per request
        batch = evaluations[start:start + size]
        request = {"invocation_id": new_id("inv"), "idempotency_key": f"{key}-{start // size}",
                   "contribution": "subscription", "organization_id": CHECK_ORGANIZATION, "record": record,
                   "evaluations": batch, "configuration": settings.configuration}
        try:
            answer = await client.invoke("subscription", request, EVALUATOR_TIMEOUT_SECONDS)
        except (PluginFailed, PluginUnreachable) as exc:
            return add([call_issue(exc)])
        run.responses.append(json.dumps(answer))
        issues = schema_issues(SUBSCRIPTION_RESPONSE_SCHEMA, answer, "schema_violation")
        if issues:
            return add(issues)
        issues = _decision_issues(answer["decisions"], [e["id"] for e in batch], record)
        if issues:
            return add(issues)
        decisions.update({d["id"]: d for d in answer["decisions"]})
    for n, expected in enumerate(document["expect"]):
        got = decisions.get(expected["id"], {}).get("decision")
        if got != expected["decision"]:
            issues.append(Issue("expectation_failed", f"{expected['id']} decided {got!r}, the fixture expects "
                                                      f"{expected['decision']!r}", pointer("expect", n, "decision")))
    add(issues)


def _decision_issues(decisions: list[dict], ids: list[str], record: dict) -> list[Issue]:
    issues = []
    seen = [d["id"] for d in decisions]
    if sorted(seen) != sorted(ids):
        issues.append(Issue("schema_violation", f"decisions name {seen}, the request's evaluations {ids}",
                            "/decisions"))
    part_keys = {part["key"] for part in record.get("parts", [])}
    for n, decision in enumerate(decisions):
        evidence = decision.get("evidence", {})
        for k, key in enumerate(evidence.get("part_keys", [])):
            if key not in part_keys:
                issues.append(Issue("schema_violation", f"part key {key!r} is not in the request",
                                    pointer("decisions", n, "evidence", "part_keys", k)))
        if len(json.dumps(evidence.get("details", {})).encode()) > MAX_DETAILS_BYTES:
            issues.append(Issue("schema_violation", "details exceed 16 KiB", pointer("decisions", n, "evidence",
                                                                                    "details")))
    return issues
