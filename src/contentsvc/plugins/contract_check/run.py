"""One run of the contract check, in the fixed order of decisions-part2: discovery, health,
fixture presence, each fixture, secrets not echoed."""

from __future__ import annotations

from pathlib import Path

from contentsvc.plugins.client import (
    PluginClient,
    PluginFailed,
    PluginTarget,
    PluginUnreachable,
)
from contentsvc.plugins.contract_check.connector import (
    check_connector_fixture,
    secret_values,
)
from contentsvc.plugins.contract_check.fixtures import Fixture, load_fixtures
from contentsvc.plugins.contract_check.normalizer import check_normalizer_fixture
from contentsvc.plugins.contract_check.report import (
    CheckReport,
    Issue,
    Recorder,
    call_issue,
)
from contentsvc.plugins.contract_check.subscription import check_subscription_fixture
from contentsvc.plugins.manifest import (
    ENGINE_PLUGIN_API,
    InstalledSettings,
    Manifest,
    PinnedManifest,
    parse_plugin_api,
    pointer,
)

MARKDOWN = "text/markdown"  # the one media type a normalizer may serve without a fixture of its own


async def run_contract_check(pinned: PinnedManifest, target: PluginTarget, fixtures_folder: Path,
                             settings: InstalledSettings) -> CheckReport:
    manifest = pinned.manifest
    run = Recorder()
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
                await check_normalizer_fixture(run, client, manifest, settings, fixtures_folder, fixture)
            elif fixture.kind == "subscription":
                await check_subscription_fixture(run, client, manifest, settings, fixture)
            elif fixture.kind == "connector":
                connector = fixture.document.get("connector")
                credentials += secret_values(connector.get("credential") if isinstance(connector, dict) else None)
                await check_connector_fixture(run, client, manifest, settings, fixture)
        echoed = [Issue("secret_echoed", "a fixture credential value appears in a response")
                  for value in credentials if any(value in text for text in run.responses)][:1]
        run.add("secrets.not_echoed", echoed)
    return run.report()


async def _discovery_checks(run: Recorder, client: PluginClient, pinned: PinnedManifest) -> None:
    manifest = pinned.manifest
    try:
        found = await client.discover()
    except (PluginFailed, PluginUnreachable) as exc:
        run.add("discovery.reachable", [call_issue(exc)])
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


def _discovery_check(run: Recorder, check_id: str, issues: list[Issue]) -> None:
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
