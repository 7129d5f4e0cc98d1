"""The plugin protocol end to end: real first-party plugin processes (`contentsvc plugin serve`)
called by the service's one plugin client (part 2 "Plugin protocol", decisions-part2 "How the
service calls plugins", "Plugin processes and first-party plugins")."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import sys

import httpx
import pypdf
import pytest

from contentsvc.plugins.client import PluginClient, PluginFailed, PluginTarget, PluginUnreachable
from contentsvc.plugins.manifest import manifest_digest
from tests.conftest import until
from tests.fixtures.plugins.make_pdf import SAMPLE_PAGES, SAMPLE_TITLE, make_pdf
from tests.integration.plugin_processes import PLUGINS, PluginProcess

TOKEN = "plugin-token-for-tests-3b9f"


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


def target_for(plugin: PluginProcess, folder: str, token: str | None = None, **changes) -> PluginTarget:
    manifest = json.loads((PLUGINS / folder / "contentsvc-plugin.json").read_bytes())
    pinned = {"plugin_id": manifest["id"], "version": manifest["version"],
              "manifest_digest": manifest_digest((PLUGINS / folder / "contentsvc-plugin.json").read_bytes()),
              "endpoint": plugin.base_url, "token": token}
    return PluginTarget(**{**pinned, **changes})


def call(target: PluginTarget, route: str, body: dict, timeout: float = 10) -> dict:
    async def go():
        async with PluginClient(target) as client:
            return await client.invoke(route, body, timeout)
    return asyncio.run(go())


def normalizer_request(path, data: bytes) -> dict:
    return {"invocation_id": "inv_test_1", "idempotency_key": "k1", "contribution": "normalizer",
            "organization_id": "org", "corpus_id": "c", "record_id": "r", "record_version_id": "v",
            "source": {"corpus_id": "c", "namespace": "n", "record_key": "k"},
            "input": {"blob_id": "blob_1", "media_type": "application/pdf", "size_bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "reference": {"url": path.as_uri()}},
            "configuration": {}}


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------- discovery, health, routing


def test_discovery_reports_the_digest_of_the_manifest_bytes(pdf_plugin):
    # part 2 "Plugin protocol": discovery {plugin_api, plugin {id, version}, manifest_digest, contributions}
    answer = httpx.get(f"{pdf_plugin.base_url}/v0/discovery").json()
    raw = (PLUGINS / "pdf" / "contentsvc-plugin.json").read_bytes()
    assert answer == {"plugin_api": "0.12", "plugin": {"id": "pdf", "version": json.loads(raw)["version"]},
                      "manifest_digest": hashlib.sha256(raw).hexdigest(), "contributions": ["normalizer"]}
    assert httpx.get(f"{pdf_plugin.base_url}/v0/health").json() == {"status": "ok"}


def test_unknown_routes_methods_and_bodies_answer_the_error_body(pdf_plugin):
    # part 2: every non-2xx plugin response carries the Error-style body with retryable
    missing = httpx.get(f"{pdf_plugin.base_url}/v0/contributions/subscription")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    wrong = httpx.get(f"{pdf_plugin.base_url}/v0/contributions/normalizer")
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    broken = httpx.post(f"{pdf_plugin.base_url}/v0/contributions/normalizer", content=b"{nope")
    assert broken.status_code == 400
    assert broken.json() == {"code": "malformed_json", "message": "the request body is not JSON", "retryable": False}


# ---------------------------------------------------------------- the pdf normalizer


def test_the_pdf_normalizer_reads_pages_and_title(pdf_plugin, tmp_path):
    # decisions-part2 "pdf": one Part per page with text, key page-N, role body; a first title Part
    data = make_pdf(SAMPLE_PAGES, SAMPLE_TITLE)
    answer = call(target_for(pdf_plugin, "pdf"), "normalizer", normalizer_request(write(tmp_path, "a.pdf", data), data))
    parts = answer["manifest"]["parts"]
    assert [(p["key"], p["role"]) for p in parts] == [("title", "title"), ("page-1", "body"), ("page-2", "body")]
    assert parts[0]["content"] == {"kind": "text", "text": SAMPLE_TITLE}
    assert "harbour cranes were inspected" in parts[1]["content"]["text"]
    assert "Bearings replaced" in parts[2]["content"]["text"]


def test_pages_without_text_are_left_out_and_no_title_without_metadata(pdf_plugin, tmp_path):
    data = make_pdf([["first page"], [], ["third page"]])
    answer = call(target_for(pdf_plugin, "pdf"), "normalizer", normalizer_request(write(tmp_path, "b.pdf", data), data))
    assert [p["key"] for p in answer["manifest"]["parts"]] == ["page-1", "page-3"]


def encrypted(data: bytes) -> bytes:
    writer = pypdf.PdfWriter(clone_from=pypdf.PdfReader(io.BytesIO(data)))
    writer.encrypt("secret-password", algorithm="RC4-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def blank_pdf() -> bytes:
    writer = pypdf.PdfWriter()
    writer.add_blank_page(width=200, height=200)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@pytest.mark.parametrize(("name", "make", "code"), [
    ("encrypted.pdf", lambda: encrypted(make_pdf(SAMPLE_PAGES)), "encrypted_pdf"),  # decisions-part2 "pdf"
    ("blank.pdf", blank_pdf, "no_text"),                                             # decisions-part2 "pdf"
    ("broken.pdf", lambda: b"%PDF-1.4\nthis is not a pdf at all\n", "invalid_pdf"),  # bytes pypdf cannot read
    ("truncated.pdf", lambda: make_pdf(SAMPLE_PAGES)[:300], "invalid_pdf"),
])
def test_unreadable_pdfs_are_terminal_plugin_errors(pdf_plugin, tmp_path, name, make, code):
    # part 2: retryable is authoritative; encrypted or text-less PDF: retryable false; never a 500
    data = make()
    with pytest.raises(PluginFailed) as caught:
        call(target_for(pdf_plugin, "pdf"), "normalizer", normalizer_request(write(tmp_path, name, data), data))
    assert (caught.value.code, caught.value.retryable, caught.value.status) == (code, False, 422)


def test_a_blob_that_differs_from_the_request_is_refused(pdf_plugin, tmp_path):
    # decisions-part2: input.sha256/size_bytes are the verified Blob's; the plugin checks them
    data = make_pdf(SAMPLE_PAGES)
    request = normalizer_request(write(tmp_path, "c.pdf", data), data)
    request["input"]["sha256"] = "0" * 64
    with pytest.raises(PluginFailed) as caught:
        call(target_for(pdf_plugin, "pdf"), "normalizer", request)
    assert (caught.value.code, caught.value.retryable) == ("blob_mismatch", False)


def test_invocations_are_logged_without_bodies(pdf_plugin, tmp_path):
    # decisions-part2 "Logging": plugin, contribution, invocation_id, status, duration; never bodies or text
    data = make_pdf([["confidential sentence zebra"]])
    request = normalizer_request(write(tmp_path, "d.pdf", data), data)
    request["invocation_id"] = "inv_logged_once"
    call(target_for(pdf_plugin, "pdf"), "normalizer", request)
    # The plugin writes its line once the answer is sent: it may reach the file a moment after.
    lines = until(lambda: [json.loads(line) for line in pdf_plugin.log().splitlines() if "inv_logged_once" in line],
                  "the invocation's log line", timeout=5.0)
    assert lines and lines[-1]["event"] == "plugin_invocation"
    assert {k: lines[-1][k] for k in ("plugin", "contribution", "status")} == \
        {"plugin": "pdf", "contribution": "normalizer", "status": 200}
    assert "duration_ms" in lines[-1]
    assert "zebra" not in pdf_plugin.log() and "d.pdf" not in pdf_plugin.log()


# ---------------------------------------------------------------- tokens, pins, reachability


def test_a_token_protected_plugin_refuses_every_route_without_it(evaluator_plugin):
    # decisions-part2: 401 invalid_plugin_token to any call without it, /v0/health included
    for route in ("health", "discovery", "contributions/subscription", "no/such/route"):
        answer = httpx.get(f"{evaluator_plugin.base_url}/v0/{route}",
                           headers={"Authorization": "Bearer wrong"} if route == "discovery" else {})
        assert answer.status_code == 401, route
        assert answer.json()["code"] == "invalid_plugin_token" and answer.json()["retryable"] is False
    # the client without the token cannot confirm the build: unreachable (retried), not a plugin decision
    with pytest.raises(PluginUnreachable) as caught:
        call(target_for(evaluator_plugin, "fixture_evaluator"), "subscription", {})
    assert (caught.value.cause, caught.value.status) == ("unauthorized", 401)
    assert "invalid_plugin_token" in caught.value.message
    assert TOKEN not in evaluator_plugin.log()  # the token is never logged


def test_discovery_naming_another_build_makes_the_plugin_unreachable(pdf_plugin, tmp_path):
    # decisions-part2: id, version or manifest_digest differing from the registration = unreachable
    data = make_pdf(SAMPLE_PAGES)
    request = normalizer_request(write(tmp_path, "e.pdf", data), data)
    for changes, cause in (({"manifest_digest": "0" * 64}, "digest_mismatch"),
                           ({"version": "9.9.9"}, "identity_mismatch"),
                           ({"plugin_id": "other"}, "identity_mismatch")):
        with pytest.raises(PluginUnreachable) as caught:
            call(target_for(pdf_plugin, "pdf", **changes), "normalizer", request)
        assert caught.value.cause == cause


def test_a_plugin_that_is_down_is_unreachable(tmp_path):
    # decisions-part2: unreachable = connect failure, timeout, or non-2xx without the error body
    from contentsvc.processes.local_service import free_port

    target = PluginTarget("pdf", "0.1.0", "0" * 64, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(PluginUnreachable) as caught:
        call(target, "normalizer", {})
    assert caught.value.cause == "connect"


def test_a_non_loopback_host_needs_the_token(tmp_path):
    # decisions-part2: binds loopback by default and refuses a non-loopback --host without the token
    done = subprocess.run([sys.executable, "-m", "contentsvc.cli", "plugin", "serve", "pdf", "--host", "0.0.0.0",
                           "--port", "1"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "CONTENTSVC_PLUGIN_TOKEN" in done.stderr


# ---------------------------------------------------------------- the fixture evaluator


def record(enriched: bool = False) -> dict:
    return {"corpus_id": "c", "record_id": "r", "record_version_id": "v", "enriched": enriched,
            "parts": [{"key": "title", "role": "title", "text": "Harbour"},
                      {"key": "body", "role": "body", "text": "The CRANES moved"}],
            "source": {"namespace": "n", "record_key": "k", "position": "1"}, "accepted_at": "2026-01-01T00:00:00Z",
            "provenance": {"origin": "client"}, "extensions": {}}


def evaluate(plugin: PluginProcess, expressions: list[dict], enriched: bool = False) -> dict:
    body = {"invocation_id": "inv_eval", "idempotency_key": "k", "contribution": "subscription",
            "organization_id": "org", "record": record(enriched), "configuration": {},
            "evaluations": [{"id": f"e{n}", "expression": e, "configuration": {}, "subscriptions": []}
                            for n, e in enumerate(expressions, start=1)]}
    return call(target_for(plugin, "fixture_evaluator", token=TOKEN), "subscription", body)


def test_the_fixture_evaluator_decides_deterministically(evaluator_plugin):
    # decisions-part2 "fixture-evaluator": contains / decision / require_enriched
    decisions = evaluate(evaluator_plugin, [{"contains": "cranes"}, {"contains": "ship"}, {"decision": "no_match"},
                                            {"contains": "cranes", "require_enriched": True}])["decisions"]
    assert decisions[0] == {"id": "e1", "decision": "match",
                            "evidence": {"explanation": 'contains "cranes"', "part_keys": ["body"]}}
    assert [d["decision"] for d in decisions] == ["match", "no_match", "no_match", "not_ready"]
    enriched = evaluate(evaluator_plugin, [{"contains": "harbour", "require_enriched": True}], enriched=True)
    assert enriched["decisions"][0]["evidence"]["part_keys"] == ["title"]


@pytest.mark.parametrize(("fail", "retryable"), [("retryable", True), ("terminal", False)])
def test_the_fixture_evaluator_fails_on_request(evaluator_plugin, fail, retryable):
    # decisions-part2: {fail: retryable|terminal} answers the error body fixture_failure
    with pytest.raises(PluginFailed) as caught:
        evaluate(evaluator_plugin, [{"decision": "match"}, {"fail": fail}])
    assert (caught.value.code, caught.value.retryable) == ("fixture_failure", retryable)


def test_the_fixture_evaluator_refuses_an_invalid_expression(evaluator_plugin):
    # decisions-part2: exactly one of contains / decision / fail; else invalid_expression, terminal
    for expression in ({"contains": "a", "decision": "match"}, {"contains": ""}, {"other": 1}):
        with pytest.raises(PluginFailed) as caught:
            evaluate(evaluator_plugin, [expression])
        assert (caught.value.code, caught.value.retryable) == ("invalid_expression", False)
