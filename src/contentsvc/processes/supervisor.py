"""`contentsvc run`: one child process per kind in the process registry.

Each child is the same command a container runs (`serve`, `projector run
NAME`, `worker run NAME`); a child that dies is restarted with backoff.
Ctrl-C stops them all.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from contentsvc.config.environment import CONFIG_VARIABLE, child_environment
from contentsvc.logging import get_logger
from contentsvc.processes.registry import API, PROCESSES, ProcessKind

log = get_logger("contentsvc.processes.supervisor")


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", *args], env=env)


def _label(kind: ProcessKind) -> str:
    return kind.name if kind.role == API else f"{kind.role}:{kind.name}"


def run_all(database_url: str, host: str, port: int, config_file: Path | None = None) -> int:
    # Every child reads the file this process read (decisions-part2: Startup configuration).
    env = child_environment(CONTENTSVC_DATABASE_URL=database_url,
                            **({CONFIG_VARIABLE: str(config_file)} if config_file else {}))
    specs = {_label(kind): kind.command + (["--host", host, "--port", str(port)] if kind.role == API else [])
             for kind in PROCESSES}
    children: dict[str, subprocess.Popen | None] = {name: _spawn(args, env) for name, args in specs.items()}
    restarts = {name: 0 for name in specs}
    started_at = {name: time.monotonic() for name in specs}
    restart_at: dict[str, float] = {}
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    base_url = f"http://{host}:{port}"
    ready = False
    while not stopping:
        if not ready:
            try:
                if httpx.get(f"{base_url}/v0/health", timeout=1.0).status_code == 200:
                    ready = True
                    log.info("contentsvc_ready", base_url=f"{base_url}/v0", processes=sorted(specs))
            except httpx.HTTPError:
                pass
        now = time.monotonic()
        for name, child in list(children.items()):
            if child is None:
                if now >= restart_at[name]:
                    children[name] = _spawn(specs[name], env)
                    started_at[name] = now
                continue
            code = child.poll()
            if code is not None:
                # Back off only for a child that keeps dying soon after start.
                restarts[name] = restarts[name] + 1 if now - started_at[name] < 30 else 1
                delay = min(30.0, 0.25 * 2 ** min(restarts[name], 7))
                log.warning("child_exited", process=name, code=code, restart_in_s=delay)
                children[name] = None
                restart_at[name] = now + delay
        time.sleep(0.2)

    running = [child for child in children.values() if child is not None]
    for child in running:
        child.terminate()
    deadline = time.time() + 10
    for child in running:
        try:
            child.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.kill()
    log.info("contentsvc_stopped")
    return 0
