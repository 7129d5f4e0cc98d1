"""Part 1's normalizer diagnostics, each produced by a real plugin process answering badly on
purpose (tests/fixtures/plugins/misbehaving: the first line of the Blob says how), through a
real `contentsvc run` whose contentsvc.toml pins it (decisions-part2 "Startup configuration"):
`application/x-misbehave` as a required route, `text/x-misbehave` as an optional one.

One server and one plugin process serve the whole module; each test has its own records."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServerProcess, client_for, create_corpus, key_for, wait_current, wait_resolved
from tests.e2e.test_uploads import blob_command, verified_blob, version_of
from tests.fixtures.plugins.misbehaving.plugin import MARKER_DIR_VARIABLE, calls
from tests.integration.plugin_processes import TEST_PLUGINS, PluginProcess

MISBEHAVING = TEST_PLUGINS / "misbehaving"
REQUIRED = "application/x-misbehave"
OPTIONAL = "text/x-misbehave"
# The manifest's retry budget is 3 attempts of at most 3 s, with backoff 1, 2 s between them:
# every case resolves well within this bound.
RESOLVE_BOUND_S = 60


def pin_misbehaving(folder: Path, port: int) -> Path:
    """A deployment folder whose contentsvc.toml pins the misbehaving plugin at `port`, its
    manifest copied beside it: one required and one optional route (decisions-part2 `routes`)."""
    deploy = folder / "deploy"
    (deploy / "misbehaving").mkdir(parents=True)
    shutil.copy(MISBEHAVING / "contentsvc-plugin.json", deploy / "misbehaving")
    config = deploy / "contentsvc.toml"
    config.write_text(
        f'[plugins.misbehaving]\nendpoint = "http://127.0.0.1:{port}"\nversion = "1.0.0"\n'
        'manifest = "misbehaving/contentsvc-plugin.json"\n'
        f'routes = [{{media_type = "{REQUIRED}"}}, {{media_type = "{OPTIONAL}", optional = true}}]\n')
    return config


class Deployment:
    def __init__(self, server: ServerProcess, plugin: PluginProcess, marker_dir: Path, client: httpx.Client,
                 corpus: str) -> None:
        self.server, self.plugin, self.marker_dir, self.client, self.corpus = server, plugin, marker_dir, client, corpus

    def blob_input(self, first_line: str, text: str, media_type: str = REQUIRED) -> tuple[str, bytes]:
        """A verified Blob whose first line (a behaviour, then a label) tells the plugin how to
        answer; (blob_id, its bytes)."""
        data = f"{first_line}\n{text}\n".encode()
        return verified_blob(self.client, data, media_type)["blob_id"], data

    def submit(self, command: dict) -> str:
        r = self.client.post("/v0/records", json=command)
        # part 2 "Plugin registration and plan": a media type the active plan routes is accepted
        assert r.status_code == 202, r.text
        return r.json()["receipt_id"]

    def ingest_blob(self, first_line: str, text: str, media_type: str = REQUIRED) -> tuple[str, bytes]:
        """Submits a Blob ingest as its own Record; (receipt_id, the Blob's bytes)."""
        blob_id, data = self.blob_input(first_line, text, media_type)
        record_key = f"{first_line.replace(' ', '-')}-{uuid.uuid4().hex[:8]}"
        return self.submit(blob_command(self.corpus, record_key, blob_id, media_type)), data

    def resolved(self, receipt_id: str) -> dict:
        return wait_resolved(self.client, receipt_id, timeout=RESOLVE_BOUND_S)

    def search(self, word: str) -> set[str]:
        r = self.client.post("/v0/search", json={"query": word, "corpus_ids": [self.corpus], "mode": "lexical"})
        assert r.status_code == 200, r.text
        return {hit["record_id"] for hit in r.json()["items"]}


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("misbehaving")
    marker_dir = folder / "markers"
    marker_dir.mkdir()
    plugin = PluginProcess("misbehaving", folder, module="tests.fixtures.plugins.misbehaving.plugin",
                           extra_env={MARKER_DIR_VARIABLE: str(marker_dir)})
    server = None
    try:
        url = databases.create()
        server = ServerProcess(url, folder, {"CONTENTSVC_CONFIG": str(pin_misbehaving(folder, plugin.port))})
        with client_for(server, key_for(url, "org-misbehave")) as client:
            corpus = create_corpus(client, f"misbehave-{uuid.uuid4().hex[:8]}")
            yield Deployment(server, plugin, marker_dir, client, corpus)
    finally:
        if server is not None:
            server.stop()
        plugin.stop()
    assert "Traceback" not in server.log_path.read_text(errors="replace")  # errors are envelopes, never a stack


def invocations(deployment: Deployment, first_line: str) -> dict[str, list[str]]:
    """The plugin's calls for inputs with this first line: idempotency key -> invocation ids, in call order."""
    out: dict[str, list[str]] = {}
    for key, invocation_id, said in calls(deployment.marker_dir):
        if said == first_line:
            out.setdefault(key, []).append(invocation_id)
    return out


def assert_quarantined_by(deployment: Deployment, receipt: dict, code: str, first_line: str) -> dict:
    """The Receipt resolved `created` with a quarantined Version whose one diagnostic is `code`,
    naming the plugin, the contribution and the invocation (part 1 "Diagnostic"): one the plugin
    received for the (one) input with this first line."""
    assert receipt["outcome"] == "created", receipt
    assert receipt["availability"]["state"] == "quarantined", receipt
    assert [d["code"] for d in receipt["diagnostics"]] == [code], receipt
    version = version_of(deployment.client, receipt)
    assert version["availability"]["state"] == "quarantined" and version["availability"]["searchable"] is False
    [diagnostic] = version["diagnostics"]
    assert diagnostic["code"] == code and diagnostic["retryable"] is False, diagnostic
    assert diagnostic["plugin"] == "misbehaving" and diagnostic["contribution"] == "normalizer", diagnostic
    [received] = invocations(deployment, first_line).values()
    assert diagnostic["invocation_id"] in received, (diagnostic, received)
    return diagnostic


def test_a_terminal_error_quarantines_the_version_as_normalizer_failed(deployment):
    # part1 Diagnostic: normalizer_failed, "normalizer answered a terminal error; Version quarantined"
    receipt_id, _ = deployment.ingest_blob("fail", "never normalized")
    diagnostic = assert_quarantined_by(deployment, deployment.resolved(receipt_id), "normalizer_failed", "fail")
    assert "misbehave_failed" in diagnostic["message"]  # the plugin's own code is said


def test_a_terminal_error_whose_message_holds_u0000_quarantines_the_version_too(deployment):
    # docs/decisions.md: a plugin's error message is stored in the Version's diagnostic, and no stored
    # text holds U+0000: it is kept with U+FFFD in its place, and the fold goes on
    receipt_id, _ = deployment.ingest_blob("fail-nul", "never normalized either")
    diagnostic = assert_quarantined_by(deployment, deployment.resolved(receipt_id), "normalizer_failed", "fail-nul")
    assert "this input always fails\ufffd" in diagnostic["message"]


def test_an_answer_breaking_the_rules_quarantines_the_version_as_normalizer_invalid_output(deployment):
    # part1 Diagnostic: normalizer_invalid_output (duplicate Part); nothing published
    receipt_id, _ = deployment.ingest_blob("invalid", "twice the same key")
    receipt = deployment.resolved(receipt_id)
    assert_quarantined_by(deployment, receipt, "normalizer_invalid_output", "invalid")
    # nothing of the answer is published: the quarantined Version keeps the Blob as accepted
    parts = version_of(deployment.client, receipt)["manifest"]["parts"]
    assert all(part["content"]["kind"] == "blob" for part in parts), parts


def test_an_answer_holding_u0000_quarantines_the_version_and_holds_up_nothing_else(deployment):
    # part1 Diagnostic: normalizer_invalid_output. Text holding U+0000 cannot be stored (docs/decisions.md
    # "Normalizer plugins"): published, it would stop the materializer's fold for every Version after it.
    receipt_id, _ = deployment.ingest_blob("nul", "a text the plugin ends with U+0000")
    diagnostic = assert_quarantined_by(deployment, deployment.resolved(receipt_id), "normalizer_invalid_output", "nul")
    assert "U+0000" in diagnostic["message"]
    after, _ = deployment.ingest_blob("ok", "normalized after it")
    assert deployment.resolved(after)["state"] == "resolved"


def test_retryable_errors_until_the_budget_is_spent_quarantine_as_normalizer_retries_exhausted(deployment):
    # part1 Diagnostic: normalizer_retries_exhausted, after the manifest's retry.max_attempts (3)
    receipt_id, _ = deployment.ingest_blob("retryable", "always busy")
    receipt = deployment.resolved(receipt_id)
    assert_quarantined_by(deployment, receipt, "normalizer_retries_exhausted", "retryable")
    # part 2 normalizer request: one idempotency key across retries, an invocation id per attempt
    [received] = invocations(deployment, "retryable").values()
    assert len(received) == 3 and len(set(received)) == 3, received


def test_a_retryable_error_then_an_answer_publishes_without_a_diagnostic(deployment):
    # part1 Diagnostic: a retryable error is retried within the budget; an answer then publishes normally
    word = f"flakyword{uuid.uuid4().hex[:8]}"
    receipt_id, _ = deployment.ingest_blob("flaky", f"the {word} answered on the second call")
    receipt = deployment.resolved(receipt_id)
    assert receipt["outcome"] == "created" and receipt["diagnostics"] == [], receipt
    version = version_of(deployment.client, receipt)
    assert version["diagnostics"] == []
    assert [p["content"]["text"] for p in version["manifest"]["parts"]] == [f"the {word} answered on the second call"]
    # part1 rule 19: searchable like any other Version
    receipt = wait_current(deployment.client, receipt)
    assert receipt["availability"]["searchable"] is True, receipt
    assert receipt["record_id"] in deployment.search(word)


def test_a_slow_normalizer_times_out_as_normalizer_timeout_without_holding_up_other_ingests(deployment):
    # part1 Diagnostic: normalizer_timeout, "invocations kept timing out until the retry budget was spent"
    slow_id, _ = deployment.ingest_blob("slow", "never in time")
    deadline = time.time() + RESOLVE_BOUND_S
    slow = {}
    while time.time() < deadline and slow.get("processing", {}).get("state") != "retrying":
        r = deployment.client.get(f"/v0/ingestion-receipts/{slow_id}")
        assert r.status_code == 200, r.text
        slow = r.json()
        time.sleep(0.05)
    assert slow["state"] == "pending" and slow["processing"]["state"] == "retrying", slow
    # part1 "Diagnostic" (plugin retried with backoff) + decisions-part2: the rest of the journal moves on
    # meanwhile: a text ingest into the same corpus resolves while the slow one still waits.
    word = f"plainword{uuid.uuid4().hex[:8]}"
    text = deployment.submit({"idempotency_key": uuid.uuid4().hex,
                              "source": {"corpus_id": deployment.corpus, "namespace": "test",
                                         "record_key": f"plain-{uuid.uuid4().hex[:8]}"},
                              "content": {"kind": "text", "text": f"a {word} beside a slow one"}})
    plain = wait_resolved(deployment.client, text, timeout=RESOLVE_BOUND_S)
    still = deployment.client.get(f"/v0/ingestion-receipts/{slow_id}").json()
    assert plain["outcome"] == "created" and plain["diagnostics"] == [], plain
    assert still["state"] == "pending", still  # the text Receipt resolved first
    assert_quarantined_by(deployment, deployment.resolved(slow_id), "normalizer_timeout", "slow")


def test_an_optional_route_falls_back_to_the_text_path_and_lists_the_code(deployment):
    # part1 Diagnostic: "On an optional route, every quarantining code that comes from the normalizer
    # instead leaves a searchable Version published through the built-in text path, with the code listed";
    # decisions-part2 `routes = [{media_type, optional = true}]`.
    word = f"fallbackword{uuid.uuid4().hex[:8]}"
    receipt_id, data = deployment.ingest_blob("fail optional", f"the {word} read by the text path", OPTIONAL)
    receipt = deployment.resolved(receipt_id)
    assert receipt["outcome"] == "created", receipt
    assert receipt["availability"]["state"] != "quarantined", receipt
    assert [d["code"] for d in receipt["diagnostics"]] == ["normalizer_failed"], receipt
    version = version_of(deployment.client, receipt)
    [diagnostic] = version["diagnostics"]
    assert diagnostic["code"] == "normalizer_failed" and diagnostic["plugin"] == "misbehaving", diagnostic
    assert diagnostic["contribution"] == "normalizer", diagnostic
    [received] = invocations(deployment, "fail optional").values()
    assert diagnostic["invocation_id"] in received, (diagnostic, received)
    # the built-in text path reads the whole Blob as its text
    [part] = version["manifest"]["parts"]
    assert part["content"] == {"kind": "text", "text": part["content"]["text"]}
    assert part["content"]["text"].strip() == data.decode().strip(), part
    receipt = wait_current(deployment.client, receipt)
    assert receipt["availability"]["searchable"] is True, receipt
    assert receipt["record_id"] in deployment.search(word)


def test_a_later_different_answer_for_the_same_key_keeps_the_first_as_normalizer_conflict(deployment):
    # part1 Diagnostic: normalizer_conflict, "a later invocation with the same idempotency key returned
    # different output; the first recorded output is kept and published". One Version, two Blob Parts
    # (decisions.md ManifestContent): the drift Part answers at once, the flaky Part asks to be retried,
    # so both are invoked again with the same keys, and the drift Part then answers differently.
    drift_blob, _ = deployment.blob_input("drift", "the drifting part")
    flaky_blob, _ = deployment.blob_input("flaky", "the flaky part")
    receipt_id = deployment.submit({
        "idempotency_key": uuid.uuid4().hex,
        "source": {"corpus_id": deployment.corpus, "namespace": "uploads", "record_key": f"two-{uuid.uuid4().hex[:8]}"},
        "content": {"kind": "manifest", "parts": [
            {"key": "drift", "role": "body", "content": {"kind": "blob", "blob_id": drift_blob, "media_type": REQUIRED}},
            {"key": "flaky", "role": "body", "content": {"kind": "blob", "blob_id": flaky_blob, "media_type": REQUIRED}},
        ]}})
    receipt = deployment.resolved(receipt_id)
    [drift_calls] = invocations(deployment, "drift").values()
    assert len(drift_calls) >= 2, drift_calls  # the drift Part was invoked again with its key
    assert receipt["outcome"] == "created", receipt
    assert receipt["availability"]["state"] != "quarantined", receipt
    assert [d["code"] for d in receipt["diagnostics"]] == ["normalizer_conflict"], receipt
    version = version_of(deployment.client, receipt)
    [diagnostic] = version["diagnostics"]
    assert diagnostic["plugin"] == "misbehaving" and diagnostic["contribution"] == "normalizer", diagnostic
    assert diagnostic["invocation_id"] in drift_calls[1:], (diagnostic, drift_calls)  # the later invocation
    texts = [p["content"]["text"] for p in version["manifest"]["parts"]]
    assert texts == ["the drifting part (answer 1 for this key)", "the flaky part"], texts
