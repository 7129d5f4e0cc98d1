"""A first-party plugin as an operator runs it: `contentsvc plugin serve NAME --port P`, a real
process on a free loopback port, stopped by its own process id."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from contentsvc.outbound_http import verifying_context
from contentsvc.processes.local_service import free_port

CHECKOUT = Path(__file__).resolve().parents[2]
PLUGINS = CHECKOUT / "src" / "contentsvc_plugins"
TEST_PLUGINS = CHECKOUT / "tests" / "fixtures" / "plugins"
CONTENTSVC = [sys.executable, "-m", "contentsvc.cli"]


class PluginProcess:
    def __init__(self, name: str, log_dir: Path, token: str | None = None, module: str | None = None,
                 extra_env: dict[str, str] | None = None, args: tuple[str, ...] = ()):
        """`name` is a first-party plugin; or `module` names a test plugin module run with the port
        (and `args` after it). `extra_env` adds variables a test plugin reads."""
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"plugin-{name}-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("CONTENTSVC_PLUGIN_TOKEN", "CONTENTSVC_CONFIG")}
        env.update(extra_env or {})
        if token:
            env["CONTENTSVC_PLUGIN_TOKEN"] = token
        self._log = open(self.log_path, "wb")
        command = [sys.executable, "-m", module, str(self.port), *args] if module else \
            [*CONTENTSVC, "plugin", "serve", name, "--port", str(self.port)]
        env["PYTHONPATH"] = str(CHECKOUT)  # test plugin modules live in the checkout's tests/
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=log_dir)
        self._wait_listening()

    def _wait_listening(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1, verify=verifying_context()) as client:  # one client, on the one TLS context
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"plugin {self.name} exited: {self.log()}")
                try:
                    client.get(f"{self.base_url}/v0/discovery")
                    return  # any answer (401 included) means it listens
                except httpx.HTTPError:
                    time.sleep(0.1)
        raise RuntimeError(f"plugin {self.name} did not listen within {timeout} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
