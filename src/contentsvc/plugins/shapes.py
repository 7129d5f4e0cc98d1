"""Requests and answers of the plugin administration routes (part 2 "Plugin registration and
plan"; decisions-part2 "Registration request", "Activation, plans, rollback"), and the checks of
a registration request that refuse it at once with 422 `invalid_plugin` and a field pointer.

Pure: no I/O. Decoding base64 and parsing the manifest happen here; writing fixtures does not.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import Meta

from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Input, NonEmpty, Output
from contentsvc.plugins.manifest import (
    InstalledSettings,
    ManifestError,
    PinnedManifest,
    SettingsError,
    installed_settings,
    parse_manifest,
    roles,
)

MAX_FIXTURE_FILES = 100  # part 2 Limits: plugin fixtures in a registration
MAX_FIXTURE_BYTES = 4 * 1024 * 1024  # decoded, in total
# The request's own bound: the fixtures' base64 (4/3 of 4 MiB) plus a manifest and settings.
MAX_REGISTRATION_BODY_BYTES = 8 * 1024 * 1024
ARTIFACT_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")

IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=256)]


# ---------------------------------------------------------------- requests


class FixtureFile(Input, kw_only=True):
    path: str
    content_base64: str


class RegistrationSettings(Input, kw_only=True):
    configuration: dict[str, Any] | None = None
    routes: list[dict[str, Any]] | None = None
    kinds: list[str] | None = None
    spaces: list[str] | None = None


class RegistrationRequest(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    manifest: NonEmpty  # the exact manifest text
    endpoint: NonEmpty
    settings: RegistrationSettings = msgspec.field(default_factory=RegistrationSettings)
    fixtures: list[FixtureFile] = msgspec.field(default_factory=list)
    artifact_digest: str | None = None
    token: NonEmpty | None = None


class ActivationRequest(Input, kw_only=True):
    idempotency_key: IdempotencyKey


class RollbackRequest(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    plan_id: NonEmpty | None = None
    pinned_work: Literal["finish", "stop"] = "finish"


# ---------------------------------------------------------------- answers


class CheckIssue(Output, kw_only=True):
    code: str
    message: str
    path: str


class CheckEntry(Output, kw_only=True):
    id: str
    title: str
    status: Literal["pass", "fail", "skip"]
    issues: list[CheckIssue]
    contribution: str | None = None
    fixture: str | None = None


class CheckObject(Output, kw_only=True):
    certified: bool
    checked_at: str
    passed: int
    failed: int
    skipped: int
    checks: list[CheckEntry]


RegistrationState = Literal["registered", "validated", "rejected", "active", "draining", "inactive"]


class PluginRegistration(Output, kw_only=True):
    registration_id: str
    plugin_id: str
    version: str
    endpoint: str
    manifest_digest: str
    contributions: list[str]
    roles: list[str]
    state: RegistrationState
    created_at: str
    updated_at: str
    artifact_digest: str | None = None


class PluginRegistrationDetail(PluginRegistration, kw_only=True):
    pinned_work: int  # always shown, 0 included
    check: CheckObject | None = None  # absent until the contract check ran


class PluginRegistrationList(Output, kw_only=True):
    items: list[PluginRegistration]


class PlanRoleView(Output, kw_only=True):
    role: str
    registration_id: str
    plugin_id: str
    version: str


class PipelinePlan(Output, kw_only=True):
    plan_id: str
    created_at: str
    activated_at: str
    source: Literal["configuration", "activation", "rollback"]
    roles: list[PlanRoleView]
    previous_plan_id: str | None = None


class PipelinePlanPage(Output, kw_only=True):
    items: list[PipelinePlan]
    next_page_cursor: str | None = None


class ActivePlugin(Output, kw_only=True):
    plugin_id: str
    version: str
    roles: list[str]


class ActivePlugins(Output, kw_only=True):
    items: list[ActivePlugin]
    plan_activated_at: str | None = None


# ---------------------------------------------------------------- checking a registration request


@dataclass(frozen=True)
class CheckedRegistration:
    """A registration request that may be registered: what the event and the fixture files hold."""

    pinned: PinnedManifest
    settings: InstalledSettings
    roles: list[str]
    endpoint: str
    fixtures: list[tuple[str, bytes]]


def invalid_plugin(field: str, message: str) -> ApiError:
    return ApiError(422, "invalid_plugin", message, field=field)


def check_registration(req: RegistrationRequest) -> CheckedRegistration:
    """decisions-part2 "Registration request": every refusal at once is 422 invalid_plugin with the
    pointer of what is refused (the first one found, in member order)."""
    try:
        pinned = parse_manifest(req.manifest.encode("utf-8"))
    except ManifestError as exc:
        raise invalid_plugin("/manifest", f"The manifest is not a valid plugin manifest: {exc}") from None
    if not _http_url(req.endpoint):
        raise invalid_plugin("/endpoint", "endpoint must be an absolute http(s) URL.")
    raw_settings = {name: value for name, value in msgspec.to_builtins(req.settings).items() if value is not None}
    try:
        settings = installed_settings(pinned.manifest, raw_settings)
    except SettingsError as exc:
        raise invalid_plugin("/settings" + exc.pointer, f"settings{exc.pointer}: {exc.message}") from None
    fixtures = _fixtures(req.fixtures)
    if req.artifact_digest is not None and not ARTIFACT_DIGEST.match(req.artifact_digest):
        raise invalid_plugin("/artifact_digest", "artifact_digest must be sha256:<64 lowercase hex digits>.")
    return CheckedRegistration(pinned, settings, roles(pinned.manifest, settings), req.endpoint, fixtures)


def _http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and "\x00" not in value


def _fixtures(files: list[FixtureFile]) -> list[tuple[str, bytes]]:
    if len(files) > MAX_FIXTURE_FILES:
        raise invalid_plugin("/fixtures", f"At most {MAX_FIXTURE_FILES} fixture files may be registered.")
    seen: set[str] = set()
    decoded: list[tuple[str, bytes]] = []
    total = 0
    for n, item in enumerate(files):
        problem = path_problem(item.path)
        if problem is None and item.path in seen:
            problem = "appears twice"
        if problem is not None:
            raise invalid_plugin(f"/fixtures/{n}/path", f"fixtures[{n}].path {problem}.")
        seen.add(item.path)
        try:
            content = base64.b64decode(item.content_base64, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_plugin("/fixtures", f"fixtures[{n}].content_base64 is not base64.") from None
        total += len(content)
        if total > MAX_FIXTURE_BYTES:
            raise invalid_plugin("/fixtures", f"The fixtures exceed {MAX_FIXTURE_BYTES} bytes decoded in total.")
        decoded.append((item.path, content))
    return decoded


def path_problem(path: str) -> str | None:
    """Why a fixture path could leave its folder (or name no file), or None."""
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL"
    if "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "is absolute"
    parts = path.split("/")
    if ".." in parts:
        return "contains .."
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' segment"
    return None
