"""`contentsvc run`: the API and every projector as child processes.

Each child is the same command a container runs (`serve`, `projector run
NAME`); a child that dies is restarted with backoff. Ctrl-C stops them all.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from contentsvc.logging import get_logger
from projectors import registry

log = get_logger("contentsvc.supervisor")


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", *args], env=env)


def run_all(database_url: str, host: str, port: int) -> int:
    env = dict(os.environ, CONTENTSVC_DATABASE_URL=database_url)
    specs = {"api": ["serve", "--host", host, "--port", str(port), "--no-migrate"]}
    specs.update({f"projector:{name}": ["projector", "run", name] for name in registry()})
    children = {name: _spawn(args, env) for name, args in specs.items()}
    restarts = {name: 0 for name in specs}
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
        for name, child in list(children.items()):
            code = child.poll()
            if code is not None and not stopping:
                restarts[name] += 1
                delay = min(30.0, 0.5 * 2 ** min(restarts[name], 6))
                log.warning("child_exited", process=name, code=code, restart_in_s=delay)
                time.sleep(delay)
                children[name] = _spawn(specs[name], env)
        time.sleep(0.2)

    for child in children.values():
        child.terminate()
    deadline = time.time() + 10
    for child in children.values():
        try:
            child.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            child.kill()
    log.info("contentsvc_stopped")
    return 0
