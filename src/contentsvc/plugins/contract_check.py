"""The contract check (decisions-part2, "Contract check"): runs a plugin through its discovery,
its health and its own fixtures, and reports every check and issue.

Run by the `plugins` worker for a new registration and by `contentsvc plugin check`
locally; both call `run_contract_check` with the pinned manifest, the plugin's address
and the folder its fixture files are in. The order is fixed; a failed `discovery.*`
check skips everything after it. `failed` = 0 means validated, and `certified` means
validated with nothing skipped.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from contentsvc.ids import new_id
from contentsvc.plugins.client import PluginClient, PluginFailed, PluginTarget, PluginUnreachable
from contentsvc.plugins.manifest import (
    ENGINE_PLUGIN_API,
    MANIFEST_FILE,
    InstalledSettings,
    Manifest,
    ManifestError,
    PinnedManifest,
    SettingsError,
    installed_settings,
    parse_manifest,
    parse_plugin_api,
    pointer,
    validate_against,
)

CHECK_ORGANIZATION = "org_contract_check"  # requests of the check name no real Organization
EVALUATOR_TIMEOUT_SECONDS = 10.0  # [monitoring] evaluator_timeout_seconds' default
FETCH_TIMEOUT_SECONDS = 60.0  # [connectors] fetch_timeout_seconds' default
MARKDOWN = "text/markdown"  # the one media type a normalizer may serve without a fixture of its own


class Issue(msgspec.Struct, frozen=True):
    code: str
    message: str
    path: str = ""


class Check(msgspec.Struct, omit_defaults=True):
    id: str
    title: str
    status: str  # pass, fail, skip
    issues: list[Issue]
    contribution: str | None = None
    fixture: str | None = None


class CheckReport(msgspec.Struct):
    """Part 2's `check` object of a registration detail."""

    certified: bool
    checked_at: str
    passed: int
    failed: int
    skipped: int
    checks: list[Check]

    @property
    def validated(self) -> bool:
        return self.failed == 0


TITLES = {
    "discovery.reachable": "The plugin answers /v0/discovery",
    "discovery.identity": "Discovery names the manifest's plugin id and version",
    "discovery.manifest_digest": "Discovery reports the digest of the submitted manifest",
    "discovery.plugin_api": "The plugin speaks the manifest's plugin_api, which this engine supports",
    "discovery.contributions": "Discovery lists exactly the manifest's contributions",
    "health.ok": "The plugin is healthy",
    "fixtures.present": "Every normalizer media type and connector kind has a fixture of its own",
    "normalizer.fixture": "The normalizer answers the fixture as the protocol and the fixture expect",
    "subscription.fixture": "The evaluator answers the fixture as the protocol and the fixture expect",
    "connector.fetch": "The connector fetches the fixture's pages",
    "connector.check_credential": "The connector checks the fixture credential",
    "connector.receive": "The connector answers the fixture's push requests",
    "secrets.not_echoed": "No fixture credential value appears in any response",
}


class Fixture(msgspec.Struct, frozen=True):
    path: str  # relative to the fixtures folder, with "/" separators
    location: Path
    raw: bytes
    document: object
    kind: str | None  # normalizer, subscription, connector; None when not recognised


def load_fixtures(folder: Path) -> list[Fixture]:
    """Every `.json` file under the folder, in path order (decisions-part2: fixture files anywhere under it)."""
    if not folder.is_dir():
        return []
    fixtures = []
    for location in sorted(folder.rglob("*.json")):
        if not location.is_file():
            continue
        raw = location.read_bytes()
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            document = None
        fixtures.append(Fixture(path=location.relative_to(folder).as_posix(), location=location, raw=raw,
                                document=document, kind=_fixture_kind(document)))
    return fixtures


def _fixture_kind(document: object) -> str | None:
    if not isinstance(document, dict):
        return None
    if "evaluations" in document:  # part 2: subscription fixtures are told apart by top-level evaluations
        return "subscription"
    if "connector" in document:
        return "connector"
    if "input" in document:
        return "normalizer"
    return None


class _Run:
    """One run of the check: the checks so far, the responses seen (for secrets.not_echoed)."""

    def __init__(self) -> None:
        self.checks: list[Check] = []
        self.responses: list[str] = []
        self.stopped = False

    def add(self, check_id: str, issues: list[Issue], *, contribution: str | None = None,
            fixture: str | None = None, skip: bool = False) -> Check:
        if self.stopped or skip:
            # A skipped check lists no issue: the issue codes are the contract's, and a skip is not one.
            status, issues = "skip", []
        else:
            status = "fail" if issues else "pass"
        check = Check(id=check_id, title=TITLES[check_id], status=status, issues=issues, contribution=contribution,
                      fixture=fixture)
        self.checks.append(check)
        return check

    def report(self) -> CheckReport:
        counts = {status: sum(1 for c in self.checks if c.status == status) for status in ("pass", "fail", "skip")}
        return CheckReport(certified=counts["fail"] == 0 and counts["skip"] == 0,
                           checked_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                           passed=counts["pass"], failed=counts["fail"], skipped=counts["skip"], checks=self.checks)


def _call_issue(exc: Exception) -> Issue:
    if isinstance(exc, PluginUnreachable):
        if exc.cause == "timeout":
            return Issue("timeout", exc.message)
        if exc.cause in ("unexpected_status", "invalid_response", "invalid_discovery"):
            return Issue("unexpected_status", exc.message)
        return Issue("unreachable", exc.message)
    assert isinstance(exc, PluginFailed)
    return Issue("unexpected_status", f"answered {exc.status} {exc.code}: {exc.message}")


async def run_contract_check(pinned: PinnedManifest, target: PluginTarget, fixtures_folder: Path,
                             settings: InstalledSettings) -> CheckReport:
    manifest = pinned.manifest
    run = _Run()
    async with PluginClient(target) as client:
        await _discovery_checks(run, client, pinned)
        if not run.stopped:
            try:
                health = await client.health()
                issues = [] if health.get("status") == "ok" else [
                    Issue("unhealthy", "health answered 200 without status ok", "/status")]
            except (PluginFailed, PluginUnreachable) as exc:
                issues = [Issue("timeout" if getattr(exc, "cause", None) == "timeout" else "unhealthy", str(exc))]
            run.add("health.ok", issues)
        else:
            run.add("health.ok", [])
        fixtures = load_fixtures(fixtures_folder)
        run.add("fixtures.present", _presence_issues(manifest, settings, fixtures))
        credentials: list[str] = []
        for fixture in fixtures:
            if fixture.kind == "normalizer":
                await _normalizer_fixture(run, client, manifest, settings, fixtures_folder, fixture)
            elif fixture.kind == "subscription":
                await _subscription_fixture(run, client, manifest, settings, fixture)
            elif fixture.kind == "connector":
                credentials += _secret_values(fixture.document.get("connector", {}).get("credential"))
                _connector_fixture(run, manifest, fixture)
        echoed = [Issue("secret_echoed", "a fixture credential value appears in a response")
                  for value in credentials if any(value in text for text in run.responses)][:1]
        run.add("secrets.not_echoed", echoed)
    return run.report()


async def _discovery_checks(run: _Run, client: PluginClient, pinned: PinnedManifest) -> None:
    manifest = pinned.manifest
    try:
        found = await client.discover()
    except (PluginFailed, PluginUnreachable) as exc:
        run.add("discovery.reachable", [_call_issue(exc)])
        run.stopped = True
        for check_id in ("discovery.identity", "discovery.manifest_digest", "discovery.plugin_api",
                         "discovery.contributions"):
            run.add(check_id, [])
        return
    run.add("discovery.reachable", [])

    identity = []
    if found.plugin_id != manifest.id:
        identity.append(Issue("identity_mismatch", f"discovery names plugin {found.plugin_id!r}, the manifest "
                                                   f"{manifest.id!r}", "/plugin/id"))
    if found.version != manifest.version:
        identity.append(Issue("identity_mismatch", f"discovery names version {found.version!r}, the manifest "
                                                   f"{manifest.version!r}", "/plugin/version"))
    _discovery_check(run, "discovery.identity", identity)

    digest = [] if found.manifest_digest == pinned.digest else [
        Issue("digest_mismatch", f"discovery reports {found.manifest_digest}, the submitted manifest's digest is "
                                 f"{pinned.digest}", "/manifest_digest")]
    _discovery_check(run, "discovery.manifest_digest", digest)

    api = []
    try:
        spoken = parse_plugin_api(found.plugin_api)
    except ValueError:
        spoken = None
    if spoken is None or spoken != manifest.plugin_api_version or spoken > ENGINE_PLUGIN_API:
        api.append(Issue("unsupported_plugin_api", f"discovery reports plugin_api {found.plugin_api!r}, the "
                                                   f"manifest {manifest.plugin_api!r}", "/plugin_api"))
    _discovery_check(run, "discovery.plugin_api", api)

    declared = manifest.contributions.names()
    contributions = [] if sorted(set(found.contributions)) == sorted(declared) and \
        len(found.contributions) == len(declared) else [
        Issue("contribution_mismatch", f"discovery lists {found.contributions}, the manifest declares {declared}",
              "/contributions")]
    _discovery_check(run, "discovery.contributions", contributions)


def _discovery_check(run: _Run, check_id: str, issues: list[Issue]) -> None:
    run.add(check_id, issues)
    if issues:
        run.stopped = True


def _presence_issues(manifest: Manifest, settings: InstalledSettings, fixtures: list[Fixture]) -> list[Issue]:
    issues = [Issue("invalid_fixture", f"{f.path} is not a normalizer, subscription or connector fixture", "")
              for f in fixtures if f.kind is None]
    covered_types = {f.document["input"].get("media_type") for f in fixtures
                     if f.kind == "normalizer" and isinstance(f.document["input"], dict)}
    covered_kinds = {f.document["connector"].get("kind") for f in fixtures
                     if f.kind == "connector" and isinstance(f.document["connector"], dict)}
    declared_types = manifest.contributions.normalizer.media_types if manifest.contributions.normalizer else []
    for route in settings.routes:
        if route.media_type != MARKDOWN and route.media_type not in covered_types:
            issues.append(Issue("fixture_missing", f"no normalizer fixture for {route.media_type}",
                                pointer("contributions", "normalizer", "media_types",
                                        declared_types.index(route.media_type))))
    declared_kinds = [k.kind for k in manifest.contributions.connector.kinds] if manifest.contributions.connector \
        else []
    for kind in settings.kinds:
        if kind not in covered_kinds:
            issues.append(Issue("fixture_missing", f"no connector fixture for kind {kind}",
                                pointer("contributions", "connector", "kinds", declared_kinds.index(kind))))
    return issues


# ---------------------------------------------------------------- normalizer fixtures

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


def _schema_issues(schema: dict, instance: object, code: str, prefix: str = "") -> list[Issue]:
    return [Issue(code, issue.message, prefix + issue.pointer) for issue in validate_against(schema, instance)][:20]


async def _normalizer_fixture(run: _Run, client: PluginClient, manifest: Manifest, settings: InstalledSettings,
                              folder: Path, fixture: Fixture) -> None:
    def add(issues: list[Issue]) -> None:
        run.add("normalizer.fixture", issues, contribution="normalizer", fixture=fixture.path)

    if run.stopped:
        return add([])
    normalizer = manifest.contributions.normalizer
    if normalizer is None:
        return add([Issue("invalid_fixture", "the manifest declares no normalizer contribution", "/input")])
    document = fixture.document
    issues = _schema_issues(NORMALIZER_FIXTURE_SCHEMA, document, "invalid_fixture")
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
        return add([_call_issue(exc)])
    run.responses.append(json.dumps(answer))
    namespaces = [extension.namespace for extension in normalizer.extensions]
    issues = _schema_issues(normalizer_response_schema(normalizer.max_parts, namespaces), answer, "schema_violation")
    if issues:
        return add(issues)
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


# ---------------------------------------------------------------- subscription fixtures

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


async def _subscription_fixture(run: _Run, client: PluginClient, manifest: Manifest, settings: InstalledSettings,
                                fixture: Fixture) -> None:
    def add(issues: list[Issue]) -> None:
        run.add("subscription.fixture", issues, contribution="subscription", fixture=fixture.path)

    if run.stopped:
        return add([])
    subscription = manifest.contributions.subscription
    if subscription is None:
        return add([Issue("invalid_fixture", "the manifest declares no subscription contribution", "/evaluations")])
    document = fixture.document
    issues = _schema_issues(SUBSCRIPTION_FIXTURE_SCHEMA, document, "invalid_fixture")
    for n, evaluation in enumerate(document.get("evaluations", []) if not issues else []):
        issues += _schema_issues(subscription.expression_schema, evaluation["expression"], "invalid_fixture",
                                 pointer("evaluations", n, "expression"))
        issues += _schema_issues(subscription.configuration_schema, evaluation.get("configuration", {}),
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
            return add([_call_issue(exc)])
        run.responses.append(json.dumps(answer))
        issues = _schema_issues(SUBSCRIPTION_RESPONSE_SCHEMA, answer, "schema_violation")
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


# ---------------------------------------------------------------- connector fixtures


def _connector_fixture(run: _Run, manifest: Manifest, fixture: Fixture) -> None:
    """Connector fixtures are recognised and counted, but this version does not run them: each check
    is reported as skipped, so a connector registration can validate but is not certified."""
    document = fixture.document
    run.add("connector.fetch", [], contribution="connector", fixture=fixture.path, skip=True)
    if isinstance(document.get("check_credential"), dict):
        run.add("connector.check_credential", [], contribution="connector", fixture=fixture.path, skip=True)
    if document.get("receive"):
        run.add("connector.receive", [], contribution="connector", fixture=fixture.path, skip=True)


def _secret_values(credential: object) -> list[str]:
    """Every string leaf of a fixture credential long enough to recognise in a response."""
    if isinstance(credential, str):
        return [credential] if len(credential) >= 4 else []
    if isinstance(credential, dict):
        return [value for item in credential.values() for value in _secret_values(item)]
    if isinstance(credential, list):
        return [value for item in credential for value in _secret_values(item)]
    return []


# ---------------------------------------------------------------- `contentsvc plugin check`


class UsageError(ValueError):
    """A check that cannot start: exit 2."""


def _local_target(folder: Path, endpoint: str | None, settings_file: Path | None,
                  token: str | None) -> tuple[PinnedManifest, PluginTarget, InstalledSettings]:
    manifest_path = folder / MANIFEST_FILE
    try:
        pinned = parse_manifest(manifest_path.read_bytes())
    except OSError as exc:
        raise UsageError(f"{manifest_path}: {exc.strerror}") from None
    except ManifestError as exc:
        raise UsageError(f"{manifest_path}: {exc}") from None
    raw_settings: dict = {}
    if settings_file is not None:
        try:
            raw_settings = tomllib.loads(settings_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"{settings_file}: {exc}") from None
    try:
        settings = installed_settings(pinned.manifest, raw_settings)
    except SettingsError as exc:
        raise UsageError(f"{settings_file}: {exc}") from None
    if endpoint is None:
        from contentsvc_plugins.catalog import first_party_for_plugin_id

        entry = first_party_for_plugin_id(pinned.manifest.id)
        if entry is None:
            raise UsageError(f"{pinned.manifest.id} is not a first-party plugin: name its address with --endpoint")
        endpoint = f"http://127.0.0.1:{entry.port}"
    if not endpoint.startswith(("http://", "https://")):
        raise UsageError(f"--endpoint {endpoint}: not an http(s) URL")
    target = PluginTarget(pinned.manifest.id, pinned.manifest.version, pinned.digest, endpoint, token)
    return pinned, target, settings


def check_command(folder: Path, endpoint: str | None, settings_file: Path | None, token: str | None,
                  as_json: bool = False) -> int:
    """decisions-part2, "Operator CLI additions": exit 0 validated, 1 rejected, 2 usage error."""
    import asyncio

    try:
        pinned, target, settings = _local_target(folder, endpoint, settings_file, token)
    except UsageError as exc:
        print(f"plugin check: {exc}", file=sys.stderr)
        return 2
    report = asyncio.run(run_contract_check(pinned, target, folder / "fixtures", settings))
    if as_json:
        print(msgspec.json.encode(report).decode())
    else:
        print(render(report, pinned.manifest, target.endpoint), end="")
    return 0 if report.validated else 1


def render(report: CheckReport, manifest: Manifest, endpoint: str) -> str:
    lines = [f"{manifest.id} {manifest.version} at {endpoint}"]
    for check in report.checks:
        where = f" [{check.fixture}]" if check.fixture else ""
        lines.append(f"  {check.status:<4}  {check.id}{where}")
        lines += [f"          {issue.code} {issue.path}: {issue.message}" for issue in check.issues]
    verdict = "validated" + (" and certified" if report.certified else "") if report.validated else "rejected"
    lines.append(f"{verdict}: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    return "\n".join(lines) + "\n"

