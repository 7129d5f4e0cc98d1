"""The startup configuration through the command line, as an operator meets it
(decisions-part2: "Startup configuration"; operator CLI `contentsvc config check`)."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from contentsvc.processes.local_service import free_port
from contentsvc.processes.registry import PROCESSES
from tests.conftest import ServerProcess, json_lines

CREDENTIAL_KEY = base64.b64encode(b"c" * 32).decode()


def cli(cwd: Path, *args: str, **variables: str) -> subprocess.CompletedProcess:
    # Only the variables a test names: the suite's own CONTENTSVC_* settings stay out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTENTSVC_")}
    return subprocess.run([sys.executable, "-m", "contentsvc.cli", *args], cwd=cwd, env={**env, **variables},
                          capture_output=True, text=True, timeout=60)


def test_config_check_prints_the_effective_configuration_with_secrets_masked(tmp_path):
    config = tmp_path / "deploy" / "contentsvc.toml"
    config.parent.mkdir()
    config.write_text('home = "state"\ndatabase_url = "postgresql://svc:hunter2@db/contentsvc"\n'
                      '[connectors]\ncredential_key = "env:SVC_CREDENTIAL_KEY"\ninterval_floor_seconds = 45\n')
    out = cli(tmp_path, "config", "check", "--config", str(config),
              SVC_CREDENTIAL_KEY=CREDENTIAL_KEY, CONTENTSVC_PORT="9123")
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and CREDENTIAL_KEY not in out.stdout
    assert f"# sha256: {hashlib.sha256(config.read_bytes()).hexdigest()}" in out.stdout
    printed = tomllib.loads(out.stdout)
    assert printed["database_url"] == "***" and printed["connectors"]["credential_key"] == "***"
    assert printed["connectors"]["interval_floor_seconds"] == 45
    assert printed["home"] == str(config.parent / "state")  # relative to the file's folder
    assert printed["api"]["port"] == 9123  # the environment wins

    # no file: defaults and environment only, said so
    out = cli(tmp_path, "config", "check")
    assert out.returncode == 0, out.stderr
    assert "# no configuration file" in out.stdout


def test_an_invalid_configuration_stops_serve_before_it_listens(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[connectors]\ninterval_floor_seconds = 0\n")
    port = free_port()
    out = cli(tmp_path, "serve", "--config", str(config), "--port", str(port))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "configuration error: connectors.interval_floor_seconds: must be an integer from 1 to 86400"]
    with socket.socket() as s:  # nothing took the port
        s.bind(("127.0.0.1", port))

    out = cli(tmp_path, "run", "--config", str(tmp_path / "missing.toml"))
    assert (out.returncode, out.stderr.splitlines()) == (2, [
        f"configuration error: {tmp_path / 'missing.toml'}: no such configuration file (named by --config)"])
    out = cli(tmp_path, "config", "check", "--config", str(config))
    assert out.returncode == 2 and "connectors.interval_floor_seconds" in out.stderr
    # Every process of a deployment reads the same file: a worker takes --config as a projector does.
    for process in (["projector", "run", "readmodel"], ["worker", "run", "monitor"]):
        out = cli(tmp_path, *process, "--config", str(config))
        assert out.returncode == 2 and "connectors.interval_floor_seconds" in out.stderr, (process, out.stderr)


def test_every_process_of_run_reads_the_same_file(database_url, tmp_path):
    config = tmp_path / "contentsvc.toml"
    config.write_text('[connectors]\ncredential_key = "env:SVC_CREDENTIAL_KEY"\n[changes]\nretention_seconds = 86400\n')
    sha256 = hashlib.sha256(config.read_bytes()).hexdigest()
    listed = cli(tmp_path, "projector", "list", SVC_CREDENTIAL_KEY=CREDENTIAL_KEY)  # reads ./contentsvc.toml too
    assert listed.returncode == 0, listed.stderr
    projectors = listed.stdout.split()
    server = ServerProcess(database_url, tmp_path, extra_env={"CONTENTSVC_CONFIG": str(config),
                                                              "SVC_CREDENTIAL_KEY": CREDENTIAL_KEY})
    try:
        # The supervisor, the API, one per projector and one per worker (the registry's other kinds).
        expected = 1 + len(PROCESSES)
        assert set(projectors) <= {kind.name for kind in PROCESSES}
        deadline = time.monotonic() + 60
        while True:
            loaded = [e for e in json_lines(server.log_path) if e.get("event") == "config_loaded"]
            if len(loaded) >= expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(loaded) == expected, server.tail()
        assert {(e["file"], e["sha256"]) for e in loaded} == {(str(config), sha256)}
        assert CREDENTIAL_KEY not in server.log_path.read_text()
    finally:
        server.stop()
