"""`contentsvc run` as a child process, on a database of its own: how the end-to-end
tests and the benchmarks start the service (the same command a user runs)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from contentsvc.config.environment import child_environment
from contentsvc.outbound_http import verifying_context


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_database(admin_url: str, prefix: str, template: str | None = None) -> str:
    """A new database on admin_url's server, empty or a copy of the `template` database; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    params = conninfo_to_dict(admin_url)
    params["dbname"] = name
    return make_conninfo(**params)


def drop_database(admin_url: str, url: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{conninfo_to_dict(url)["dbname"]}" WITH (FORCE)')


def health_status(client: httpx.Client, base_url: str) -> int | None:
    """What GET /v0/health answers at base_url; None while nothing answers there."""
    try:
        return client.get(f"{base_url}/v0/health").status_code
    except httpx.HTTPError:
        return None


def wait_healthy(base_url: str, process: subprocess.Popen | None = None, timeout: float = 60.0,
                 status: int = 200) -> str | None:
    """Until base_url's health answers `status` (a plugin started with a token answers 401): None,
    or why it did not (`process` ended first, or `timeout` s passed)."""
    deadline = time.monotonic() + timeout
    # One client for every look, on the process's one TLS context: a new client per look built
    # a context each time (36 ms of CPU here), most of a core taken from the starting server.
    with httpx.Client(timeout=1, verify=verifying_context()) as client:
        while health_status(client, base_url) != status:
            if process is not None and process.poll() is not None:
                return f"exited with {process.returncode}"
            if time.monotonic() > deadline:
                return f"not ready after {timeout:.0f} s"
            time.sleep(0.05)
    return None


class LocalService:
    """`contentsvc run` on its own port and CONTENTSVC_HOME, logging to a file; ready when
    constructed (its health answers)."""

    def __init__(self, database_url: str, log_path: Path, home: Path, extra_env: dict[str, str] | None = None,
                 ready_timeout: float = 90.0) -> None:
        self.database_url = database_url
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.home = home
        env = child_environment(CONTENTSVC_DATABASE_URL=database_url, CONTENTSVC_HOME=str(home), **(extra_env or {}))
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "contentsvc.cli", "run", "--port", str(self.port)],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.wait_ready(ready_timeout)

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def wait_ready(self, timeout: float = 60.0) -> None:
        if (why := wait_healthy(self.base_url, self.process, timeout)) is not None:
            self.stop()
            raise RuntimeError(f"server {why}:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM to the whole process group (the supervisor and its children), then SIGKILL."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
            except ProcessLookupError:
                pass
        self._log.close()
