"""A deployment of separate processes for crash tests: `serve` plus the named projectors,
each its own process on one database and one CONTENTSVC_HOME, so that one projector
can be killed with SIGKILL and restarted while the others run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg

from contentsvc.auth import keys
from contentsvc.processes.local_service import free_port
from tests.conftest import wait_healthy


class Stack:
    def __init__(self, url: str, tmp_path: Path, projectors: tuple[str, ...], **env: str) -> None:
        self.url = url
        self.home = tmp_path / "home"
        self.log_path = tmp_path / "processes.log"
        self.log = open(self.log_path, "wb")  # the processes write to it until close()
        self.env = dict(os.environ, CONTENTSVC_DATABASE_URL=url, CONTENTSVC_HOME=str(self.home), COLUMNS="250",
                        PYTHONUNBUFFERED="1", **env)
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.api = self.spawn(["serve", "--port", str(port), "--no-migrate"])
        self.projectors = {name: self.spawn(["projector", "run", name]) for name in projectors}
        with psycopg.connect(url, autocommit=True) as conn:
            self.secret = keys.create_key(conn, "crash", keys.parse_actions("*"), None, None).secret
        self.client = self.new_client()
        wait_healthy(self.base_url, self.api, self.log_path)

    def new_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers={"Authorization": f"Bearer {self.secret}"}, timeout=30)

    def spawn(self, args: list[str]) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", *args], env=self.env,
                                stdout=self.log, stderr=subprocess.STDOUT)

    def log_count(self, event: str) -> int:
        """How many times the processes logged `event` (a projector logs opening its generation at start)."""
        return self.log_path.read_text(errors="replace").count(f'"{event}"')

    def kill(self, name: str) -> None:
        self.projectors[name].send_signal(signal.SIGKILL)
        self.projectors[name].wait()

    def restart(self, name: str) -> None:
        self.projectors[name] = self.spawn(["projector", "run", name])

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "contentsvc.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def close(self) -> None:
        for p in [self.api, *self.projectors.values()]:
            p.kill()
            p.wait()
        self.client.close()
        self.log.close()


def ingest_batch(client: httpx.Client, cmds: list[dict]) -> list[str]:
    r = client.post("/v0/records/batch", json={"entries": cmds})
    assert r.status_code == 200, r.text
    assert all(item["status"] == 202 for item in r.json()["items"])
    return [item["receipt"]["receipt_id"] for item in r.json()["items"]]


def command(corpus: str, key: str, text: str) -> dict:
    return {"idempotency_key": uuid.uuid4().hex, "source": {"corpus_id": corpus, "namespace": "n", "record_key": key},
            "content": {"kind": "text", "text": text}}
