"""The plugin manifest: meta-schema, embedded schemas, plugin_api gating, digest, pointers
(decisions-part2, "Manifest file")."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from contentsvc.plugins.manifest import (
    ManifestError,
    SettingsError,
    installed_settings,
    manifest_digest,
    meta_schema,
    parse_manifest,
    pointer,
    roles,
    stored_manifest,
    validate_against,
)

PLUGINS = Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins"

NORMALIZER = {
    "manifest_version": 1, "id": "pdf", "version": "1.2.3", "plugin_api": "0.1", "title": "PDF",
    "contributions": {"normalizer": {"media_types": ["application/pdf"]}},
}
CONNECTOR = {
    "manifest_version": 1, "id": "social", "version": "0.1.0", "plugin_api": "0.12", "title": "Social",
    "contributions": {"connector": {"kinds": [{
        "kind": "social_list", "description": "lists", "config_schema": {"type": "object", "title": "Social list"},
        "credential": "required", "default_interval_seconds": 120, "max_items": 40,
        "attachments": {"max_bytes": 1000},
        "push": {"relay": True, "routes": [{"name": "receive", "path": "receive/{list}", "methods": ["POST"],
                                            "auth": "signature", "signature_header": "x-hub-signature-256",
                                            "request_schema": {"type": "object"}}]},
    }]}},
}


def encode(document: dict) -> bytes:
    return json.dumps(document).encode()


def refusal(document: dict) -> ManifestError:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(encode(document))
    return caught.value


def test_the_meta_schema_is_a_2020_12_schema():
    # decisions-part2: the meta-schema is JSON Schema 2020-12
    Draft202012Validator.check_schema(meta_schema())
    assert meta_schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_defaults_fill_the_typed_manifest():
    # decisions-part2: configuration_schema, retry and max_parts defaults
    pinned = parse_manifest(encode(NORMALIZER))
    manifest = pinned.manifest
    assert manifest.configuration_schema == {"type": "object", "additionalProperties": False}
    assert (manifest.retry.max_attempts, manifest.retry.timeout_seconds) == (3, 30)
    assert manifest.contributions.normalizer.max_parts == 256
    assert manifest.contributions.names() == ["normalizer"]
    assert pinned.digest == hashlib.sha256(encode(NORMALIZER)).hexdigest()


def test_a_connector_manifest_with_every_feature_parses():
    kind = parse_manifest(encode(CONNECTOR)).manifest.contributions.connector.kinds[0]
    assert kind.limits.max_checkpoint_bytes == 65536 and kind.limits.max_pages_per_run == 100
    assert kind.push.routes[0].window_seconds == 300


def test_a_stored_manifest_reads_as_parsed_and_a_refused_one_is_refused_every_time():
    # The registry's copy is parsed once per process (registrations are immutable); a text that
    # does not parse is not remembered, so it is refused on every read as before.
    text = encode(NORMALIZER).decode()
    assert stored_manifest(text) == parse_manifest(text.encode())
    assert stored_manifest(text) is stored_manifest(text)
    broken = encode({**NORMALIZER, "unknown_member": 1}).decode()
    for _ in range(2):
        with pytest.raises(ManifestError):
            stored_manifest(broken)


def test_the_first_party_manifests_are_valid():
    # decisions-part2: each first-party plugin ships its contentsvc-plugin.json; plugin_id = its name
    manifests = sorted(PLUGINS.glob("*/contentsvc-plugin.json"))
    assert manifests
    for path in manifests:
        manifest = parse_manifest(path.read_bytes()).manifest
        assert manifest.id == path.parent.name.replace("_", "-") or manifest.id == path.parent.name


@pytest.mark.parametrize(("change", "where"), [
    (lambda d: d.update(extra=1), "/extra"),                                   # unknown member
    (lambda d: d["contributions"]["normalizer"].update(mystery=True), "/contributions/normalizer/mystery"),
    (lambda d: d.pop("title"), "/title"),                                      # required member
    (lambda d: d.update(manifest_version=2), "/manifest_version"),
    (lambda d: d.update(id="Bad Id"), "/id"),
    (lambda d: d.update(version="1.0"), "/version"),                           # not semver
    (lambda d: d.update(plugin_api="0.12.1"), "/plugin_api"),                  # MAJOR.MINOR
    (lambda d: d.update(plugin_api="0.13"), "/plugin_api"),                    # newer than the engine
    (lambda d: d.update(plugin_api="1.0"), "/plugin_api"),
    (lambda d: d.update(contributions={}), "/contributions"),                  # at least one key
    (lambda d: d.update(retry={"max_attempts": 6}), "/retry/max_attempts"),
    (lambda d: d.update(retry={"timeout_seconds": 0}), "/retry/timeout_seconds"),
    (lambda d: d["contributions"]["normalizer"].update(media_types=[]), "/contributions/normalizer/media_types"),
    (lambda d: d["contributions"]["normalizer"].update(media_types=["t/x"] * 2),
     "/contributions/normalizer/media_types"),
    (lambda d: d["contributions"]["normalizer"].update(max_parts=257), "/contributions/normalizer/max_parts"),
    # an embedded schema must itself be a valid 2020-12 schema
    (lambda d: d.update(configuration_schema={"type": "objekt"}), "/configuration_schema/type"),
    (lambda d: d["contributions"]["normalizer"].update(
        extensions=[{"namespace": "pdfx", "schema_version": "1", "schema": {"minLength": -1}}]),
     "/contributions/normalizer/extensions/0/schema/minLength"),
])
def test_refusals_name_the_member(change, where):
    # decisions-part2 "Manifest file": bounds, unknown members refused, errors carry a JSON Pointer
    document = copy.deepcopy(NORMALIZER)
    change(document)
    assert refusal(document).pointer == where


@pytest.mark.parametrize(("plugin_api", "where"), [
    ("0.11", "/contributions/connector/kinds/0/push/routes/0/auth"),     # signature needs 0.12
    ("0.10", "/contributions/connector/kinds/0/push/routes/0"),          # declared routes need 0.11
    ("0.4", "/contributions/connector/kinds/0/push/relay"),              # relay needs 0.5
    ("0.3", "/contributions/connector/kinds/0/attachments"),             # attachments need 0.4
    ("0.2", "/contributions/connector"),                                 # connectors need 0.3
])
def test_each_feature_needs_its_plugin_api(plugin_api, where):
    # decisions-part2: contribution requires at least plugin_api ... else invalid_plugin
    document = copy.deepcopy(CONNECTOR)
    document["plugin_api"] = plugin_api
    assert refusal(document).pointer == where


def test_subscription_ingestion_and_retrieval_need_their_plugin_api():
    subscription = {**NORMALIZER, "contributions": {"subscription": {
        "expression_schema": {"type": "object"}, "configuration_schema": {}, "max_batch_size": 4}}}
    assert refusal({**subscription, "plugin_api": "0.1"}).pointer == "/contributions/subscription"
    assert parse_manifest(encode({**subscription, "plugin_api": "0.2"})).manifest.contributions.subscription
    ingestion = {**NORMALIZER, "plugin_api": "0.5", "contributions": {"ingestion": {
        "spaces": [{"name": "s", "model": "m", "dimensions": 3, "metric": "cosine", "modalities": ["text"]}],
        "source_formats": ["text/plain"]}}}
    assert refusal(ingestion).pointer == "/contributions/ingestion"
    retrieval = {**NORMALIZER, "plugin_api": "0.6", "contributions": {"retrieval": {"profiles": [
        {"name": "p", "version": "1", "modes": ["hybrid"], "max_latency_ms": 100, "max_query_chars": 100}]}}}
    assert refusal(retrieval).pointer == "/contributions/retrieval"


def test_a_signature_route_needs_its_header_and_names_are_unique():
    document = copy.deepcopy(CONNECTOR)
    del document["contributions"]["connector"]["kinds"][0]["push"]["routes"][0]["signature_header"]
    assert refusal(document).pointer == "/contributions/connector/kinds/0/push/routes/0/signature_header"
    document = copy.deepcopy(CONNECTOR)
    kinds = document["contributions"]["connector"]["kinds"]
    kinds.append(copy.deepcopy(kinds[0]))
    assert refusal(document).pointer == "/contributions/connector/kinds/1/kind"


def test_bytes_that_are_not_a_json_object_are_refused_at_the_root():
    for raw in (b"\xff\xfe", b"{not json", b"[]", b'"text"'):
        with pytest.raises(ManifestError) as caught:
            parse_manifest(raw)
        assert caught.value.pointer == ""


@given(st.binary(max_size=512))
def test_the_digest_is_sha256_of_the_exact_bytes(raw):
    # decisions-part2: manifest_digest = lowercase hex sha256 of the file's exact bytes
    assert manifest_digest(raw) == hashlib.sha256(raw).hexdigest()


@given(st.sampled_from([" ", "\n", "\t"]), st.integers(min_value=0, max_value=4))
def test_whitespace_changes_the_digest_not_the_manifest(space, indent):
    # the digest is over bytes, so a reformatted manifest is a different build
    reformatted = json.dumps(NORMALIZER, indent=indent).encode() + space.encode()
    assert parse_manifest(reformatted).manifest == parse_manifest(encode(NORMALIZER)).manifest
    assert parse_manifest(reformatted).digest != parse_manifest(encode(NORMALIZER)).digest


@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=20))
def test_any_unknown_top_level_member_is_refused_by_name(name):
    # decisions-part2: unknown members are refused
    if name in meta_schema()["properties"]:
        return
    document = {**NORMALIZER, name: 1}
    assert refusal(document).pointer == pointer(name)


@given(st.lists(st.one_of(st.text(max_size=8), st.integers(min_value=0, max_value=99)), max_size=5))
def test_pointers_escape_tilde_and_slash(segments):
    # RFC 6901: "~" is "~0" and "/" is "~1"; unescaping gives the segments back
    text = pointer(*segments)
    decoded = [part.replace("~1", "/").replace("~0", "~") for part in text.split("/")[1:]]
    assert decoded == [str(s) for s in segments]


def test_instances_are_checked_against_declared_schemas_with_pointers():
    schema = {"type": "object", "properties": {"timeout_seconds": {"type": "integer"}}, "additionalProperties": False}
    (issue,) = validate_against(schema, {"timeout_seconds": "slow"})
    assert issue.pointer == "/timeout_seconds"
    assert validate_against(schema, {"timeout_seconds": 3}) == []


# ---------------------------------------------------------------- installed settings

CONFIGURED = {**NORMALIZER, "contributions": {"normalizer": {"media_types": ["application/pdf", "text/markdown"]}},
              "configuration_schema": {"type": "object", "additionalProperties": False,
                                       "properties": {"timeout_seconds": {"type": "integer"}}}}


def test_settings_default_to_every_declared_route_and_give_roles():
    # decisions-part2: routes default to every media type the normalizer declares, not optional
    manifest = parse_manifest(encode(CONFIGURED)).manifest
    settings = installed_settings(manifest, None)
    assert [(r.media_type, r.optional) for r in settings.routes] == [("application/pdf", False),
                                                                      ("text/markdown", False)]
    assert roles(manifest, settings) == ["normalizer:application/pdf", "normalizer:text/markdown"]


@pytest.mark.parametrize(("raw", "where"), [
    ({"configuration": {"timeout_seconds": "slow"}}, "/configuration/timeout_seconds"),
    ({"configuration": {"other": 1}}, "/configuration"),
    ({"routes": [{"media_type": "image/png"}]}, "/routes/0/media_type"),
    ({"routes": [{"media_type": "text/markdown"}, {"media_type": "text/markdown"}]}, "/routes/1/media_type"),
    ({"routes": [{"media_type": "text/markdown", "fallback": True}]}, "/routes/0"),
    ({"kinds": ["rss"]}, "/kinds/0"),
    ({"spaces": ["minilm"]}, "/spaces/0"),
    ({"colour": "blue"}, "/colour"),
])
def test_settings_the_manifest_does_not_allow_are_refused_by_pointer(raw, where):
    # decisions-part2: configuration validated against configuration_schema; routes/kinds/spaces declared
    with pytest.raises(SettingsError) as caught:
        installed_settings(parse_manifest(encode(CONFIGURED)).manifest, raw)
    assert caught.value.pointer == where
