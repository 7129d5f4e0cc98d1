"""`normalizer.fixture`: a normalizer fixture's input sent by file:// URL, the answer held to
part 2's normalizer response and part 1's Part rules, then to the fixture's expectations."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from contentsvc.domain.decoding import nul_pointer
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

NORMALIZER_FIXTURE_SCHEMA = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {"type": "object", "required": ["path", "media_type"], "properties": {
            "path": {"type": "string", "minLength": 1}, "media_type": {"type": "string", "minLength": 1}}},
        "expect": {"type": "object", "additionalProperties": False, "properties": {
            "min_parts": {"type": "integer", "minimum": 0},
            "text_contains": {"type": "array", "items": {"type": "string"}}}},
    },
}


def normalizer_response_schema(max_parts: int, namespaces: list[str]) -> dict:
    """Part 2's normalizer response: `manifest` (part 1 Parts), optional declared `extensions`,
    `language`, `warnings` (max 32 of {code max 64, message 1..1024})."""
    extensions = {"type": "object", "propertyNames": {"enum": namespaces} if namespaces else False,
                  "additionalProperties": {"type": "object", "required": ["schema_version", "data"],
                                           "properties": {"schema_version": {"type": "string"},
                                                          "data": {"type": "object"}}}}
    text = {"type": "object", "required": ["kind", "text"], "additionalProperties": False,
            "properties": {"kind": {"const": "text"}, "text": {"type": "string", "minLength": 1}}}
    blob = {"type": "object", "required": ["kind", "blob_id", "media_type"], "additionalProperties": False,
            "properties": {"kind": {"const": "blob"}, "blob_id": {"type": "string", "minLength": 1},
                           "media_type": {"type": "string", "minLength": 1}}}
    part = {"type": "object", "required": ["key", "role", "content"], "additionalProperties": False,
            "properties": {"key": {"type": "string", "minLength": 1}, "role": {"type": "string", "minLength": 1},
                           "parent_key": {"type": "string", "minLength": 1}, "content": {"oneOf": [text, blob]},
                           "extensions": extensions}}
    return {
        "type": "object",
        "required": ["manifest"],
        "properties": {
            "manifest": {"type": "object", "required": ["parts"], "properties": {
                "kind": {"const": "manifest"},
                "parts": {"type": "array", "minItems": 1, "maxItems": max_parts, "items": part}}},
            "extensions": extensions,
            "language": {"type": "string", "minLength": 1, "maxLength": 64},
            "warnings": {"type": "array", "maxItems": 32, "items": {
                "type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string", "minLength": 1, "maxLength": 64},
                    "message": {"type": "string", "minLength": 1, "maxLength": 1024}}}},
        },
    }


async def check_normalizer_fixture(run: Recorder, client: PluginClient, manifest: Manifest, settings: InstalledSettings,
                              folder: Path, fixture: Fixture) -> None:
    def add(issues: list[Issue]) -> None:
        run.add("normalizer.fixture", issues, contribution="normalizer", fixture=fixture.path)

    if run.stopped:
        return add([])
    normalizer = manifest.contributions.normalizer
    if normalizer is None:
        return add([Issue("invalid_fixture", "the manifest declares no normalizer contribution", "/input")])
    document = fixture.document
    issues = schema_issues(NORMALIZER_FIXTURE_SCHEMA, document, "invalid_fixture")
    if issues:
        return add(issues)
    media_type = document["input"]["media_type"]
    if media_type not in [route.media_type for route in settings.routes]:
        return add([Issue("invalid_fixture", f"{media_type} is not a route this plugin is installed for",
                          "/input/media_type")])
    # part 2: input read by path relative to the fixture file, referenced by absolute file:// URL
    input_path = (fixture.location.parent / document["input"]["path"]).resolve()
    if not input_path.is_relative_to(folder.resolve()) or not input_path.is_file():
        return add([Issue("invalid_fixture", "the input file is missing or outside the fixtures folder",
                          "/input/path")])
    data = input_path.read_bytes()
    request = {
        "invocation_id": new_id("inv"),
        "idempotency_key": "fixture-" + hashlib.sha256(fixture.raw).hexdigest(),
        "contribution": "normalizer",
        "organization_id": CHECK_ORGANIZATION,
        "corpus_id": "contract_check",
        "record_id": "rec_contract_check",
        "record_version_id": "ver_contract_check",
        "source": {"corpus_id": "contract_check", "namespace": "fixtures", "record_key": fixture.path},
        "input": {"blob_id": "blob_contract_check", "media_type": media_type, "size_bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest(), "reference": {"url": input_path.as_uri()}},
        "configuration": settings.configuration,
    }
    try:
        answer = await client.invoke("normalizer", request, float(manifest.retry.timeout_seconds))
    except (PluginFailed, PluginUnreachable) as exc:
        return add([call_issue(exc)])
    run.responses.append(json.dumps(answer))
    namespaces = [extension.namespace for extension in normalizer.extensions]
    issues = schema_issues(normalizer_response_schema(normalizer.max_parts, namespaces), answer, "schema_violation")
    if issues:
        return add(issues)
    if (at := nul_pointer(answer)) is not None:  # the engine would quarantine it: normalizer_invalid_output
        return add([Issue("schema_violation", "a string holds U+0000, which no stored text can", at)])
    parts = answer["manifest"]["parts"]
    issues += _part_issues(parts, request["input"])
    expect = document.get("expect", {})
    if len(parts) < expect.get("min_parts", 0):
        issues.append(Issue("expectation_failed", f"{len(parts)} part(s), the fixture expects at least "
                                                  f"{expect['min_parts']}", "/expect/min_parts"))
    text = "\n".join(part["content"]["text"] for part in parts if part["content"]["kind"] == "text")
    for n, wanted in enumerate(expect.get("text_contains", [])):
        if wanted not in text:
            issues.append(Issue("expectation_failed", f"no Part's text contains {wanted!r}",
                                pointer("expect", "text_contains", n)))
    add(issues)


def _part_issues(parts: list[dict], blob: dict) -> list[Issue]:
    """Part 1 rules a schema cannot say: unique keys, parents that exist, a Blob Part only for the input Blob."""
    issues, keys = [], set()
    for n, part in enumerate(parts):
        if part["key"] in keys:
            issues.append(Issue("schema_violation", f"part key {part['key']!r} appears twice",
                                pointer("manifest", "parts", n, "key")))
        keys.add(part["key"])
    for n, part in enumerate(parts):
        if "parent_key" in part and part["parent_key"] not in keys:
            issues.append(Issue("schema_violation", "parent_key names no Part", pointer("manifest", "parts", n,
                                                                                         "parent_key")))
        content = part["content"]
        if content["kind"] == "blob" and content["blob_id"] != blob["blob_id"]:
            issues.append(Issue("schema_violation", "a Blob Part must reference the input Blob",
                                pointer("manifest", "parts", n, "content", "blob_id")))
    return issues
