"""The contract check against real plugin processes, through `contentsvc plugin check` and
`run_contract_check` (decisions-part2, "Contract check", "Operator CLI additions")."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contentsvc.plugins.client import PluginTarget
from contentsvc.plugins.contract_check import check_command, run_contract_check
from contentsvc.plugins.manifest import installed_settings, parse_manifest
from contentsvc.processes.local_service import free_port
from tests.integration.plugin_processes import PLUGINS, TEST_PLUGINS, PluginProcess

TOKEN = "contract-check-token-51c2"
DISCOVERY_AND_AFTER = ["discovery.reachable", "discovery.identity", "discovery.manifest_digest",
                       "discovery.plugin_api", "discovery.contributions", "health.ok", "fixtures.present"]


@pytest.fixture(scope="module")
def pdf_plugin(tmp_path_factory):
    plugin = PluginProcess("pdf", tmp_path_factory.mktemp("pdf"))
    yield plugin
    plugin.stop()


@pytest.fixture(scope="module")
def evaluator_plugin(tmp_path_factory):
    plugin = PluginProcess("fixture-evaluator", tmp_path_factory.mktemp("evaluator"), token=TOKEN)
    yield plugin
    plugin.stop()


@pytest.fixture(scope="module")
def connector_plugin(tmp_path_factory):
    plugin = PluginProcess("echo-connector", tmp_path_factory.mktemp("connector"),
                           module="tests.fixtures.plugins.echo_connector.plugin")
    yield plugin
    plugin.stop()


def plugin_check(folder: Path, endpoint: str, *extra: str, token: str | None = None,
                 as_process: bool = False) -> tuple[int, dict | str]:
    """`contentsvc plugin check FOLDER --endpoint URL --json`: as a process, or (faster, the same code
    path below argument parsing) through the function the command calls."""
    if as_process:
        env = {k: v for k, v in os.environ.items() if k not in ("CONTENTSVC_PLUGIN_TOKEN", "CONTENTSVC_CONFIG")}
        if token:
            env["CONTENTSVC_PLUGIN_TOKEN"] = token
        done = subprocess.run([sys.executable, "-m", "contentsvc.cli", "plugin", "check", str(folder), "--endpoint",
                               endpoint, "--json", *extra], capture_output=True, text=True, timeout=60, env=env,
                              cwd=folder.parent, check=False)
        code, out, err = done.returncode, done.stdout, done.stderr
    else:
        settings = Path(extra[extra.index("--settings") + 1]) if "--settings" in extra else None
        out_buffer, err_buffer = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out_buffer), contextlib.redirect_stderr(err_buffer):
            code = check_command(folder, endpoint, settings, token, as_json=True)
        out, err = out_buffer.getvalue(), err_buffer.getvalue()
    if code == 2:
        return 2, err
    return code, json.loads(out.strip().splitlines()[-1])  # the report is the last line (logs may precede it)


def by_id(report: dict) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for check in report["checks"]:
        found.setdefault(check["id"], []).append(check)
    return found


def copy_plugin(name: str, tmp_path: Path, source: Path = PLUGINS) -> Path:
    target = tmp_path / name
    shutil.copytree(source / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    return target


def test_the_pdf_plugin_passes_and_is_certified(pdf_plugin):
    # decisions-part2 "Contract check": fixed order; failed = 0 -> validated; certified = validated and skipped = 0
    code, report = plugin_check(PLUGINS / "pdf", pdf_plugin.base_url, as_process=True)
    assert code == 0
    assert [c["id"] for c in report["checks"]] == [*DISCOVERY_AND_AFTER, "normalizer.fixture", "secrets.not_echoed"]
    assert all(c["status"] == "pass" and c["issues"] == [] for c in report["checks"])
    assert (report["passed"], report["failed"], report["skipped"], report["certified"]) == (9, 0, 0, True)
    fixture_check = by_id(report)["normalizer.fixture"][0]
    assert (fixture_check["fixture"], fixture_check["contribution"]) == ("inspection.json", "normalizer")


def test_the_misbehaving_test_normalizer_passes_on_its_ok_fixtures(tmp_path):
    # decisions-part2 "Contract check": the plugin the normalizer diagnostic tests misbehave through
    # keeps the protocol when asked to behave (one `ok` fixture per declared media type)
    plugin = PluginProcess("misbehaving", tmp_path, module="tests.fixtures.plugins.misbehaving.plugin")
    try:
        code, report = plugin_check(TEST_PLUGINS / "misbehaving", plugin.base_url)
    finally:
        plugin.stop()
    assert code == 0 and report["certified"] is True, report
    assert sorted(c["fixture"] for c in by_id(report)["normalizer.fixture"]) == ["ok-text.json", "ok.json"]


def test_a_normalizer_answer_holding_u0000_fails_its_fixture(tmp_path):
    # decisions-part2 "Contract check": the check fails what the engine would quarantine as
    # normalizer_invalid_output; no stored text holds U+0000 (docs/decisions.md)
    folder = copy_plugin("misbehaving", tmp_path, TEST_PLUGINS)
    (folder / "fixtures" / "nul.txt").write_text("nul\nharbour cranes\n")
    (folder / "fixtures" / "nul.json").write_text(json.dumps(
        {"input": {"path": "nul.txt", "media_type": "application/x-misbehave"}}))
    plugin = PluginProcess("misbehaving", tmp_path, module="tests.fixtures.plugins.misbehaving.plugin")
    try:
        code, report = plugin_check(folder, plugin.base_url)
    finally:
        plugin.stop()
    assert code == 1 and report["failed"] == 1, report
    [failed] = [c for c in by_id(report)["normalizer.fixture"] if c["status"] == "fail"]
    assert failed["fixture"] == "nul.json"
    issues = [(i["code"], i["path"]) for i in failed["issues"]]
    assert issues == [("schema_violation", "/manifest/parts/0/content/text")]


def test_the_fixture_evaluator_passes_with_its_token_and_fails_without(evaluator_plugin):
    # decisions-part2: the check presents CONTENTSVC_PLUGIN_TOKEN; the plugin answers 401 without it
    code, report = plugin_check(PLUGINS / "fixture_evaluator", evaluator_plugin.base_url, token=TOKEN,
                                as_process=True)
    assert code == 0 and report["certified"] is True
    assert [c["fixture"] for c in by_id(report)["subscription.fixture"]] == ["contains_match.json", "enriched.json"]
    code, report = plugin_check(PLUGINS / "fixture_evaluator", evaluator_plugin.base_url)
    assert code == 1 and report["checks"][0]["status"] == "fail"
    assert all(c["status"] == "skip" for c in report["checks"][1:])  # a failed discovery.* check skips the rest


def test_a_different_manifest_digest_is_rejected(pdf_plugin, tmp_path):
    # decisions-part2: the plugin must report the digest of the submitted manifest (digest_mismatch)
    folder = copy_plugin("pdf", tmp_path)
    manifest = folder / "contentsvc-plugin.json"
    manifest.write_bytes(manifest.read_bytes() + b"\n")  # same members, other bytes
    code, report = plugin_check(folder, pdf_plugin.base_url)
    assert code == 1 and report["failed"] == 1 and report["certified"] is False
    (check,) = by_id(report)["discovery.manifest_digest"]
    assert check["status"] == "fail"
    assert [(i["code"], i["path"]) for i in check["issues"]] == [("digest_mismatch", "/manifest_digest")]
    assert all(c["status"] == "skip" for c in report["checks"][3:])


def test_another_version_is_an_identity_mismatch(pdf_plugin, tmp_path):
    folder = copy_plugin("pdf", tmp_path)
    manifest = folder / "contentsvc-plugin.json"
    document = json.loads(manifest.read_bytes())
    manifest.write_text(json.dumps({**document, "version": "9.0.0"}))
    code, report = plugin_check(folder, pdf_plugin.base_url)
    assert code == 1
    issues = by_id(report)["discovery.identity"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("identity_mismatch", "/plugin/version")]


def test_a_plugin_that_is_down_is_unreachable(tmp_path):
    # decisions-part2 issue code `unreachable`
    code, report = plugin_check(PLUGINS / "pdf", f"http://127.0.0.1:{free_port()}")
    assert code == 1
    assert [i["code"] for i in report["checks"][0]["issues"]] == ["unreachable"]
    assert (report["passed"], report["failed"], report["skipped"]) == (0, 1, len(report["checks"]) - 1)


def test_a_normalizer_without_its_own_fixture_is_rejected(pdf_plugin, tmp_path):
    # decisions-part2: fixtures.present fails when a normalizer media type other than text/markdown has no fixture
    folder = copy_plugin("pdf", tmp_path)
    shutil.rmtree(folder / "fixtures")
    code, report = plugin_check(folder, pdf_plugin.base_url)
    assert code == 1
    issues = by_id(report)["fixtures.present"][0]["issues"]
    assert [(i["code"], i["path"]) for i in issues] == [("fixture_missing", "/contributions/normalizer/media_types/0")]


def test_unmet_expectations_and_bad_fixtures_name_their_pointer(pdf_plugin, tmp_path):
    # decisions-part2: expectation_failed / invalid_fixture, path a JSON Pointer into the fixture
    folder = copy_plugin("pdf", tmp_path)
    fixture = json.loads((folder / "fixtures" / "inspection.json").read_text())
    fixture["expect"] = {"min_parts": 50, "text_contains": ["Bearings", "a sentence that is not there"]}
    (folder / "fixtures" / "inspection.json").write_text(json.dumps(fixture))
    (folder / "fixtures" / "escape.json").write_text(json.dumps(
        {"input": {"path": "../../etc/passwd", "media_type": "application/pdf"}}))
    code, report = plugin_check(folder, pdf_plugin.base_url)
    assert code == 1
    checks = {c["fixture"]: c for c in by_id(report)["normalizer.fixture"]}
    assert [(i["code"], i["path"]) for i in checks["inspection.json"]["issues"]] == [
        ("expectation_failed", "/expect/min_parts"), ("expectation_failed", "/expect/text_contains/1")]
    assert [(i["code"], i["path"]) for i in checks["escape.json"]["issues"]] == [("invalid_fixture", "/input/path")]


def test_a_wrong_subscription_expectation_fails_at_its_decision(evaluator_plugin, tmp_path):
    # decisions-part2: subscription fixture expect [{id: "e1", decision}]
    folder = copy_plugin("fixture_evaluator", tmp_path)
    path = folder / "fixtures" / "contains_match.json"
    fixture = json.loads(path.read_text())
    fixture["expect"][1]["decision"] = "match"
    fixture["evaluations"].append({"expression": {"contains": 7}, "configuration": {}})
    path.write_text(json.dumps(fixture))
    (folder / "fixtures" / "wrong.json").write_text(json.dumps({**fixture, "evaluations": fixture["evaluations"][:4]}))
    code, report = plugin_check(folder, evaluator_plugin.base_url, token=TOKEN)
    assert code == 1
    checks = {c["fixture"]: c for c in by_id(report)["subscription.fixture"]}
    assert [(i["code"], i["path"]) for i in checks["contains_match.json"]["issues"]][0] == \
        ("invalid_fixture", "/evaluations/4/expression/contains")
    assert [(i["code"], i["path"]) for i in checks["wrong.json"]["issues"]] == [("expectation_failed",
                                                                                 "/expect/1/decision")]


def test_usage_errors_exit_2(tmp_path, pdf_plugin):
    # decisions-part2 "Operator CLI additions": exit 2 usage error
    code, message = plugin_check(tmp_path / "nowhere", pdf_plugin.base_url, as_process=True)
    assert code == 2 and "contentsvc-plugin.json" in message
    settings = tmp_path / "settings.toml"
    settings.write_text('routes = [{media_type = "image/png"}]\n')
    code, message = plugin_check(PLUGINS / "pdf", pdf_plugin.base_url, "--settings", str(settings))
    assert code == 2 and "/routes/0/media_type" in message


def test_the_check_runs_in_process_with_installed_settings(pdf_plugin):
    # the worker's path: run_contract_check with a pinned manifest and settings
    raw = (PLUGINS / "pdf" / "contentsvc-plugin.json").read_bytes()
    pinned = parse_manifest(raw)
    target = PluginTarget("pdf", pinned.manifest.version, pinned.digest, pdf_plugin.base_url)
    settings = installed_settings(pinned.manifest, {"routes": [{"media_type": "application/pdf", "optional": True}]})
    report = asyncio.run(run_contract_check(pinned, target, PLUGINS / "pdf" / "fixtures", settings))
    assert report.validated and report.certified and report.passed == 9


# ---------------------------------------------------------------- connector fixtures


def test_a_connector_passes_fetch_credential_and_receive_checks(connector_plugin):
    # decisions-part2: pages fetched from a checkpoint feeding each returned checkpoint back, credential
    # check, receive cases for push kinds
    code, report = plugin_check(TEST_PLUGINS / "echo_connector", connector_plugin.base_url)
    assert code == 0, report
    assert [c["id"] for c in report["checks"]] == [*DISCOVERY_AND_AFTER, "connector.fetch",
                                                   "connector.check_credential", "connector.receive",
                                                   "secrets.not_echoed"]
    assert report["certified"] is True and report["failed"] == 0
    assert by_id(report)["connector.fetch"][0]["fixture"] == "feed.json"


def test_a_connector_echoing_its_credential_is_rejected(connector_plugin, tmp_path):
    # decisions-part2 secrets.not_echoed: no fixture credential value appears in any response
    folder = copy_plugin("echo_connector", tmp_path, TEST_PLUGINS)
    fixture = json.loads((folder / "fixtures" / "feed.json").read_text())
    fixture["connector"]["config"]["echo"] = True
    (folder / "fixtures" / "feed.json").write_text(json.dumps(fixture))
    code, report = plugin_check(folder, connector_plugin.base_url)
    assert code == 1
    (check,) = by_id(report)["secrets.not_echoed"]
    assert check["status"] == "fail" and [i["code"] for i in check["issues"]] == ["secret_echoed"]
    assert "fixture-token-abc" not in json.dumps(report)  # the report never quotes the secret


def test_connector_expectations_and_missing_kinds_name_their_pointer(connector_plugin, tmp_path):
    folder = copy_plugin("echo_connector", tmp_path, TEST_PLUGINS)
    fixture = json.loads((folder / "fixtures" / "feed.json").read_text())
    fixture["pages"][0]["expect"]["more"] = False
    fixture["connector"]["credential"]["token"] = "another-token"
    fixture["receive"][1]["expect"]["status"] = 200
    (folder / "fixtures" / "feed.json").write_text(json.dumps(fixture))
    code, report = plugin_check(folder, connector_plugin.base_url)
    assert code == 1
    checks = by_id(report)
    assert [(i["code"], i["path"]) for i in checks["connector.fetch"][0]["issues"]] == [
        ("expectation_failed", "/pages/0/expect/more")]
    assert [i["code"] for i in checks["connector.check_credential"][0]["issues"]] == ["unexpected_status"]
    assert [(i["code"], i["path"]) for i in checks["connector.receive"][0]["issues"]] == [
        ("expectation_failed", "/receive/1/expect/status")]

    (folder / "fixtures" / "feed.json").unlink()  # decisions-part2: a connector kind needs its own fixture
    code, report = plugin_check(folder, connector_plugin.base_url)
    assert code == 1
    assert [(i["code"], i["path"]) for i in by_id(report)["fixtures.present"][0]["issues"]] == [
        ("fixture_missing", "/contributions/connector/kinds/0")]
