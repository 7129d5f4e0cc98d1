"""The check object of part 2 and how a run of the contract check records its checks."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from contentsvc.plugins.client import PluginFailed, PluginUnreachable
from contentsvc.plugins.manifest import validate_against
from contentsvc.storage.text import storable

CHECK_ORGANIZATION = "org_contract_check"  # requests of the check name no real Organization


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


class Recorder:
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
        # An issue may quote what the plugin sent (a pointer to a member, a digest it reports), and
        # the report is stored: no stored text holds U+0000.
        issues = [Issue(i.code, storable(i.message), storable(i.path)) for i in issues]
        check = Check(id=check_id, title=TITLES[check_id], status=status, issues=issues, contribution=contribution,
                      fixture=fixture)
        self.checks.append(check)
        return check

    def report(self) -> CheckReport:
        counts = {status: sum(1 for c in self.checks if c.status == status) for status in ("pass", "fail", "skip")}
        return CheckReport(certified=counts["fail"] == 0 and counts["skip"] == 0,
                           checked_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                           passed=counts["pass"], failed=counts["fail"], skipped=counts["skip"], checks=self.checks)


def call_issue(exc: Exception) -> Issue:
    if isinstance(exc, PluginUnreachable):
        if exc.cause == "timeout":
            return Issue("timeout", exc.message)
        if exc.cause in ("unexpected_status", "unauthorized", "invalid_response", "invalid_discovery"):
            return Issue("unexpected_status", exc.message)
        return Issue("unreachable", exc.message)
    assert isinstance(exc, PluginFailed)
    return Issue("unexpected_status", f"answered {exc.status} {exc.code}: {exc.message}")


def schema_issues(schema: dict, instance: object, code: str, prefix: str = "") -> list[Issue]:
    return [Issue(code, issue.message, prefix + issue.pointer) for issue in validate_against(schema, instance)][:20]
