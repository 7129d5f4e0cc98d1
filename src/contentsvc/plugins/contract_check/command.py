"""`contentsvc plugin check PATH [--endpoint URL] [--settings FILE.toml] [--json]`
(decisions-part2, "Operator CLI additions"): exit 0 validated, 1 rejected, 2 usage error."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import msgspec

from contentsvc.plugins.client import PluginTarget
from contentsvc.plugins.contract_check.report import CheckReport
from contentsvc.plugins.contract_check.run import run_contract_check
from contentsvc.plugins.manifest import (
    MANIFEST_FILE,
    InstalledSettings,
    Manifest,
    ManifestError,
    PinnedManifest,
    SettingsError,
    installed_settings,
    parse_manifest,
)


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
