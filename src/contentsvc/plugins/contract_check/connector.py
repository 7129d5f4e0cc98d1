"""`connector.fetch`, `connector.check_credential`, `connector.receive`: a connector fixture's pages
fetched feeding each checkpoint back, its credential checked, its push requests relayed."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

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

FETCH_TIMEOUT_SECONDS = 60.0  # [connectors] fetch_timeout_seconds' default
CONNECTOR_FIXTURE_SCHEMA = {
    "type": "object",
    "required": ["connector", "pages"],
    "properties": {
        "connector": {"type": "object", "required": ["kind", "config"], "properties": {
            "kind": {"type": "string"}, "config": {"type": "object"}}},
        "pages": {"type": "array", "maxItems": 100, "items": {"type": "object", "properties": {
            "expect": {"type": "object", "additionalProperties": False, "properties": {
                "min_items": {"type": "integer", "minimum": 0}, "more": {"type": "boolean"}}}}}},
        "check_credential": {"type": "object", "required": ["expect"], "properties": {
            "expect": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string"}}}}},
        "receive": {"type": "array", "maxItems": 100, "items": {
            "type": "object", "required": ["request", "expect"], "properties": {
                "request": {"type": "object", "required": ["method"], "properties": {
                    "method": {"type": "string"}, "headers": {"type": "object",
                                                              "additionalProperties": {"type": "string"}}}},
                "expect": {"type": "object", "required": ["status"], "properties": {
                    "status": {"type": "integer"}, "min_items": {"type": "integer", "minimum": 0}}}}}},
    },
}

_ITEM_SCHEMA = {
    "type": "object", "required": ["record_key", "revision", "source_position", "content"],
    "properties": {
        "record_key": {"type": "string", "minLength": 1, "maxLength": 1024},
        "revision": {"type": "string", "minLength": 1, "maxLength": 256},
        "source_position": {"type": "string", "minLength": 1, "maxLength": 256},
        "content": {"type": "object", "required": ["kind"], "properties": {"kind": {"enum": ["text", "manifest"]}}},
        "extensions": {"type": "object"},
        "withdraw": {"type": "boolean"},
        "attachments": {"type": "array", "maxItems": 64},
    },
}
RECEIVE_TIMEOUT_SECONDS = 9.0  # part 2: plugin plus ingestion stage of a push
MAX_DIAGNOSTICS_BYTES = 16 * 1024


def fetch_response_schema(max_items: int) -> dict:
    """Part 2's fetch response: items (at most the declared max_items), checkpoint required, more, reads,
    diagnostics, notice, not_due, push; unknown members are ignored."""
    return {
        "type": "object", "required": ["checkpoint"],
        "properties": {
            "items": {"type": "array", "maxItems": max_items, "items": _ITEM_SCHEMA},
            "more": {"type": "boolean"},
            "reads": {"type": "integer", "minimum": 0},
            "diagnostics": {"type": "object"},
            "notice": {"type": "string", "maxLength": 64},
            "not_due": {"type": "boolean"},
            "retry_after_seconds": {"type": "integer", "minimum": 1},
            "push": {"type": "object", "required": ["state"], "properties": {
                "state": {"enum": ["active", "pending", "failed"]},
                "error_class": {"enum": ["access", "transient", "source"]}},
                "if": {"properties": {"state": {"const": "failed"}}}, "then": {"required": ["error_class"]}},
        },
    }


RECEIVE_RESPONSE_SCHEMA = {
    "type": "object", "required": ["response"],
    "properties": {
        "response": {"type": "object", "required": ["status"], "properties": {
            "status": {"type": "integer", "minimum": 200, "maximum": 299}, "headers": {"type": "object"},
            "body_base64": {"type": "string"}}},
        "items": {"type": "array", "maxItems": 1000, "items": _ITEM_SCHEMA},
    },
}


class _ConnectorCase:
    """What every call of one connector fixture shares: the kind, the common request members."""

    def __init__(self, manifest: Manifest, settings: InstalledSettings, fixture: Fixture):
        document = fixture.document
        self.fixture = fixture
        self.kind_name = document["connector"]["kind"]
        self.kind = next(k for k in manifest.contributions.connector.kinds if k.kind == self.kind_name)
        self.connector = {"instance_id": "con_contract_check", "kind": self.kind_name,
                          "corpus_id": "contract_check", "source_namespace": f"fixtures/{fixture.path}",
                          "config": document["connector"]["config"]}
        self.credential = document["connector"].get("credential")
        self.configuration = settings.configuration

    def request(self, **members) -> dict:
        return {"invocation_id": new_id("inv"), "contribution": "connector", "organization_id": CHECK_ORGANIZATION,
                "configuration": self.configuration, "connector": self.connector, "credential": self.credential,
                "now": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), **members}


def connector_fixture_issues(manifest: Manifest, settings: InstalledSettings, fixture: Fixture) -> list[Issue]:
    document = fixture.document
    if manifest.contributions.connector is None:
        return [Issue("invalid_fixture", "the manifest declares no connector contribution", "/connector")]
    issues = schema_issues(CONNECTOR_FIXTURE_SCHEMA, document, "invalid_fixture")
    if issues:
        return issues
    kind_name = document["connector"]["kind"]
    if kind_name not in settings.kinds:
        return [Issue("invalid_fixture", f"{kind_name!r} is not a kind this plugin is installed for",
                      "/connector/kind")]
    kind = next(k for k in manifest.contributions.connector.kinds if k.kind == kind_name)
    issues = schema_issues(kind.config_schema, document["connector"]["config"], "invalid_fixture",
                            "/connector/config")
    if kind.credential_schema is not None and document["connector"].get("credential") is not None:
        issues += schema_issues(kind.credential_schema, document["connector"]["credential"], "invalid_fixture",
                                 "/connector/credential")
    return issues


async def check_connector_fixture(run: Recorder, client: PluginClient, manifest: Manifest, settings: InstalledSettings,
                             fixture: Fixture) -> None:
    """decisions-part2: pages fetched from a checkpoint, feeding each returned checkpoint back; the
    credential check; receive cases for push kinds."""
    document = fixture.document

    def add(check_id: str, issues: list[Issue]) -> None:
        run.add(check_id, issues, contribution="connector", fixture=fixture.path)

    wanted = ["connector.fetch"]
    if isinstance(document.get("check_credential"), dict):
        wanted.append("connector.check_credential")
    if document.get("receive"):
        wanted.append("connector.receive")
    if run.stopped:
        for check_id in wanted:
            add(check_id, [])
        return
    issues = connector_fixture_issues(manifest, settings, fixture)
    if issues:
        for check_id in wanted:
            add(check_id, issues)
        return
    case = _ConnectorCase(manifest, settings, fixture)
    add("connector.fetch", await _fetch_pages(run, client, case))
    if "connector.check_credential" in wanted:
        add("connector.check_credential", await _check_credential(run, client, case))
    if "connector.receive" in wanted:
        add("connector.receive", await _receive_cases(run, client, case))


def _record_failure(run: Recorder, exc: Exception) -> None:
    if isinstance(exc, PluginFailed):
        run.responses.append(exc.message)


async def _fetch_pages(run: Recorder, client: PluginClient, case: _ConnectorCase) -> list[Issue]:
    checkpoint: object = None
    reads = 0
    schema = fetch_response_schema(min(1000, case.kind.max_items))
    for n, page in enumerate(case.fixture.document["pages"]):
        request = case.request(checkpoint=checkpoint, page_in_run=n, reads_today=reads)
        try:
            answer = await client.invoke("connector/fetch", request, FETCH_TIMEOUT_SECONDS)
        except (PluginFailed, PluginUnreachable) as exc:
            _record_failure(run, exc)
            return [call_issue(exc)]
        run.responses.append(json.dumps(answer))
        issues = schema_issues(schema, answer, "schema_violation")
        if issues:
            return issues
        if len(json.dumps(answer["checkpoint"]).encode()) > case.kind.limits.max_checkpoint_bytes:
            return [Issue("schema_violation", f"the checkpoint exceeds {case.kind.limits.max_checkpoint_bytes} "
                                              "bytes", "/checkpoint")]
        if len(json.dumps(answer.get("diagnostics", {})).encode()) > MAX_DIAGNOSTICS_BYTES:
            return [Issue("schema_violation", "diagnostics exceed 16 KiB", "/diagnostics")]
        if answer.get("more") and answer["checkpoint"] == checkpoint:
            return [Issue("schema_violation", "more is true but the checkpoint did not move", "/checkpoint")]
        expect = page.get("expect", {})
        items = answer.get("items", [])
        if len(items) < expect.get("min_items", 0):
            issues.append(Issue("expectation_failed", f"page {n} has {len(items)} item(s), the fixture expects at "
                                                      f"least {expect['min_items']}",
                                pointer("pages", n, "expect", "min_items")))
        if "more" in expect and bool(answer.get("more")) != expect["more"]:
            issues.append(Issue("expectation_failed", f"page {n} answered more={bool(answer.get('more'))}",
                                pointer("pages", n, "expect", "more")))
        if issues:
            return issues
        checkpoint = answer["checkpoint"]
        reads += answer.get("reads", 0)
    return []


async def _check_credential(run: Recorder, client: PluginClient, case: _ConnectorCase) -> list[Issue]:
    expected = case.fixture.document["check_credential"]["expect"]["status"]
    try:
        answer = await client.invoke("connector/check_credential", case.request(), FETCH_TIMEOUT_SECONDS)
    except PluginFailed as exc:
        _record_failure(run, exc)
        if exc.code == expected:  # a fixture may expect a refusal by its code
            return []
        return [call_issue(exc)]
    except PluginUnreachable as exc:
        return [call_issue(exc)]
    run.responses.append(json.dumps(answer))
    if answer.get("status") != expected:
        return [Issue("expectation_failed", f"status {answer.get('status')!r}, the fixture expects {expected!r}",
                      "/check_credential/expect/status")]
    return []


async def _receive_cases(run: Recorder, client: PluginClient, case: _ConnectorCase) -> list[Issue]:
    push = case.kind.push
    route = push.routes[0].name if push is not None and push.routes and not push.relay else "relay"
    issues: list[Issue] = []
    for n, entry in enumerate(case.fixture.document["receive"]):
        fixture_request = entry["request"]
        body = fixture_request.get("body", "")
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        request = case.request(route=route, request={
            "method": fixture_request["method"], "path": "", "query": "",
            "headers": {k.lower(): v for k, v in (fixture_request.get("headers") or {}).items()},
            "body_base64": base64.b64encode(raw).decode()})
        expect = entry["expect"]
        try:
            answer = await client.invoke("connector/receive", request, RECEIVE_TIMEOUT_SECONDS)
        except (PluginFailed, PluginUnreachable) as exc:
            _record_failure(run, exc)
            status = exc.status
            if isinstance(exc, PluginUnreachable) and status is None:
                return [call_issue(exc)]
            if status != expect["status"]:  # part 2: a refusal is a non-2xx with any body, passed through
                issues.append(Issue("expectation_failed", f"answered {status}, the fixture expects "
                                                          f"{expect['status']}", pointer("receive", n, "expect",
                                                                                         "status")))
            continue
        run.responses.append(json.dumps(answer))
        found = schema_issues(RECEIVE_RESPONSE_SCHEMA, answer, "schema_violation")
        if found:
            return found
        status = answer["response"]["status"]
        if status != expect["status"]:
            issues.append(Issue("expectation_failed", f"answered {status}, the fixture expects {expect['status']}",
                                pointer("receive", n, "expect", "status")))
        if len(answer.get("items", [])) < expect.get("min_items", 0):
            issues.append(Issue("expectation_failed", f"{len(answer.get('items', []))} item(s), the fixture "
                                                      f"expects at least {expect['min_items']}",
                                pointer("receive", n, "expect", "min_items")))
    return issues


def secret_values(credential: object) -> list[str]:
    """Every string leaf of a fixture credential long enough to recognise in a response."""
    if isinstance(credential, str):
        return [credential] if len(credential) >= 4 else []
    if isinstance(credential, dict):
        return [value for item in credential.values() for value in secret_values(item)]
    if isinstance(credential, list):
        return [value for item in credential for value in secret_values(item)]
    return []
