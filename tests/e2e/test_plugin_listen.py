"""A first-party plugin whose port is taken (decisions-part2 "Plugin processes"; decisions.md
"A home in use or a port in use"): `plugin serve` says so in one JSON line and exits 69 before it
says it listens, and under `contentsvc run` (`launch`) the service runs on without it, starting
it again with backoff until the port is free."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from contentsvc.processes.listener import EXIT_BUSY
from contentsvc.processes.local_service import free_port

from tests.conftest import ServerProcess, wait_healthy
from tests.e2e.test_pdf_normalizer import _pin_pdf


def _hold(port: int) -> socket.socket:
    held = socket.socket()
    held.bind(("127.0.0.1", port))
    held.listen(1)
    return held


def test_plugin_serve_on_a_taken_port_refuses_in_one_json_line_with_exit_69():
    port = free_port()
    held = _hold(port)
    try:
        out = subprocess.run([sys.executable, "-m", "contentsvc.cli", "plugin", "serve", "pdf", "--port", str(port)],
                             capture_output=True, text=True, timeout=30)
    finally:
        held.close()
    assert out.returncode == EXIT_BUSY, out.stderr
    lines = [json.loads(line) for line in out.stderr.splitlines()]  # every line JSON (uvicorn's too)
    [refusal] = [line for line in lines if line["event"] == "port_in_use"]
    assert refusal["port"] == port and "choose another port with --port" in refusal["message"]
    assert {line["process"] for line in lines} == {"plugin:pdf"}  # as `run` names the child
    assert not [line for line in lines if line["event"] == "plugin_listening"]  # it never listened


def test_a_launched_plugin_whose_port_is_taken_is_retried_while_the_service_runs(databases, tmp_path):
    port = free_port()
    config = _pin_pdf(tmp_path, port, 'launch = "pdf"\n')
    held = _hold(port)
    server = None
    try:
        server = ServerProcess(databases.create(), tmp_path, {"CONTENTSVC_CONFIG": str(config)})  # ready: /v0/health
        deadline = time.time() + 30
        while time.time() < deadline and '"child": "plugin:pdf", "code": 69' not in server.tail():
            time.sleep(0.2)
        assert '"child": "plugin:pdf", "code": 69' in server.tail()  # exited, to be started again
        held.close()
        wait_healthy(f"http://127.0.0.1:{port}", timeout=30)  # a later start found the port free
        assert server.process.poll() is None  # the run went on throughout
    finally:
        held.close()
        if server is not None:
            server.stop()
