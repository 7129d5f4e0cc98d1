"""`contentsvc run`: one child process per kind in the process registry.

Each child is the same command a container runs (`serve`, `projector run
NAME`, `worker run NAME`); a child that dies is restarted with backoff, and
so is the embedded PostgreSQL when this process started it. An API that
cannot bind its port is not restarted: the whole run stops with EXIT_BUSY.
A `[plugins.X]` pin with `launch = "NAME"` adds one more child, `plugin serve
NAME --port <endpoint port>`, given the pin's token as CONTENTSVC_PLUGIN_TOKEN
(decisions-part2, "Startup configuration"): only this supervisor starts
plugins, never `serve` or a projector. SIGTERM or SIGINT stops every child (each also gets SIGTERM if this process
dies first, by the kernel's parent-death signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from contentsvc.config.environment import CONFIG_VARIABLE, PLUGIN_TOKEN_VARIABLE, child_environment
from contentsvc.libc import libc_function
from contentsvc.logging import get_logger
from contentsvc.outbound_http import verifying_context
from contentsvc.processes.listener import EXIT_BUSY
from contentsvc.processes.registry import API, PROCESSES, ProcessKind

log = get_logger("contentsvc.processes.supervisor")

CHILD_STOP_SECONDS = 5.0  # SIGTERM to SIGKILL; the embedded server's stop (3 s fast, then immediate) follows
POSTGRES_RETRY_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1
_prctl = libc_function("prctl")  # looked up here: the child calls it between fork and exec


def _die_with_parent(parent: int):
    """Runs in the child before exec: SIGTERM when the supervisor dies, even by SIGKILL."""

    def arm() -> None:
        if _prctl is None:  # not Linux: orphans are then the operator's to stop
            return
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(0)

    return arm


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", *args], env=env,
                            preexec_fn=_die_with_parent(os.getpid()))


def supervisor_label(kind: ProcessKind) -> str:
    """The name of a child in the supervisor's log lines and its own (`process`): `api`, `projector:NAME`."""
    return kind.name if kind.role == API else f"{kind.role}:{kind.name}"


class _PostgresWatch:
    """The embedded server this run started: restarted, same URL, when it dies."""

    def __init__(self, server) -> None:
        self.server = server
        self.down_since: float | None = None
        self.attempts = 0
        self.next_try = 0.0

    def check(self, now: float) -> None:
        from contentsvc.storage import embedded

        if self.down_since is None:
            if embedded.postmaster_alive(self.server):
                return
            self.down_since, self.attempts, self.next_try = now, 0, now
            log.warning("embedded_postgres_died", restarting=True)
        if now < self.next_try:
            return
        self.attempts += 1
        if embedded.restart(self.server):
            log.info("embedded_postgres_restarted", pid=self.server.get_pid(), attempts=self.attempts,
                     down_s=round(time.monotonic() - self.down_since, 1))
            self.down_since = None
            return
        if self.attempts % 30 == 0:  # still down: one line every half minute, not one per attempt
            log.warning("embedded_postgres_still_down", attempts=self.attempts,
                        down_s=round(time.monotonic() - self.down_since, 1), log=str(self.server.log))
        self.next_try = time.monotonic() + POSTGRES_RETRY_SECONDS


def launched_plugins(pins: dict, env: dict[str, str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The first-party plugin children of the pins with `launch`: label -> (arguments, environment).
    The pin's endpoint is loopback http with a port (the configuration checks it), so the plugin
    listens exactly where the service calls it."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    for plugin_id, pin in sorted(pins.items()):
        if pin.launch is None:
            continue
        endpoint = urlsplit(pin.endpoint)
        args = ["plugin", "serve", pin.launch, "--host", endpoint.hostname or "127.0.0.1",
                "--port", str(endpoint.port)]
        child_env = {k: v for k, v in env.items() if k != PLUGIN_TOKEN_VARIABLE}
        if pin.token:
            child_env[PLUGIN_TOKEN_VARIABLE] = pin.token
        out[f"plugin:{plugin_id}"] = (args, child_env)
    return out


def run_all(database_url: str, host: str, port: int, config_file: Path | None = None,
            embedded_server=None, plugins: dict | None = None) -> int:
    # Every child reads the file this process read (decisions-part2: Startup configuration), and
    # knows where the API listens, which the command line may have changed (the connectors worker
    # hands plugins upload grants on the API).
    env = child_environment(CONTENTSVC_DATABASE_URL=database_url, CONTENTSVC_HOST=host, CONTENTSVC_PORT=str(port),
                            **({CONFIG_VARIABLE: str(config_file)} if config_file else {}))
    launched = launched_plugins(plugins or {}, env)
    specs = {supervisor_label(kind): kind.command + (["--host", host, "--port", str(port)] if kind.role == API else [])
             for kind in PROCESSES}
    envs = {name: env for name in specs}
    for name, (args, child_env) in launched.items():
        specs[name], envs[name] = args, child_env
    stopping = {"signal": None}

    def stop(signum, _frame):
        stopping["signal"] = signal.Signals(signum).name

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    api_name = next(supervisor_label(kind) for kind in PROCESSES if kind.role == API)
    children: dict[str, subprocess.Popen | None] = {name: _spawn(args, envs[name]) for name, args in specs.items()}
    restarts = {name: 0 for name in specs}
    started_at = {name: time.monotonic() for name in specs}
    restart_at: dict[str, float] = {}
    postgres = _PostgresWatch(embedded_server) if embedded_server is not None else None
    exit_code = 0

    base_url = f"http://{host}:{port}"
    # One client for the looks until the API answers: a new one per look built a TLS context each
    # time, 36 ms of CPU every 0.2 s, taken from the children starting beside it.
    health: httpx.Client | None = httpx.Client(timeout=1.0, verify=verifying_context())
    while stopping["signal"] is None:
        if postgres is not None:
            postgres.check(time.monotonic())
        if health is not None:
            try:
                if health.get(f"{base_url}/v0/health").status_code == 200:
                    health.close()
                    health = None
                    log.info("contentsvc_ready", base_url=f"{base_url}/v0", processes=sorted(specs), pid=os.getpid())
            except httpx.HTTPError:
                pass
        now = time.monotonic()
        for name, child in list(children.items()):
            if child is None:
                if now >= restart_at[name]:
                    children[name] = _spawn(specs[name], envs[name])
                    started_at[name] = now
                continue
            code = child.poll()
            if code is None:
                continue
            children[name] = None
            # The API could not bind: restarting would fail the same way. A launched plugin that cannot
            # (EXIT_BUSY too) is restarted with backoff like any child; the service runs on without it.
            if code == EXIT_BUSY and name == api_name:
                log.error("child_cannot_listen", child=name, code=code, host=host, port=port,
                          message=f"the API cannot listen on {host}:{port}; stopping")
                stopping["signal"] = "child_cannot_listen"
                exit_code = EXIT_BUSY
                break
            # Back off only for a child that keeps dying soon after start.
            restarts[name] = restarts[name] + 1 if now - started_at[name] < 30 else 1
            delay = min(30.0, 0.25 * 2 ** min(restarts[name], 7))
            log.warning("child_exited", child=name, code=code, restart_in_s=delay)
            restart_at[name] = now + delay
        time.sleep(0.2)
    if health is not None:  # stopped before the API answered
        health.close()

    # A second signal while stopping must not cut the stop short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log.info("contentsvc_stopping", reason=stopping["signal"])
    running = [child for child in children.values() if child is not None]
    for child in running:
        child.terminate()
    deadline = time.monotonic() + CHILD_STOP_SECONDS
    for child in running:
        try:
            child.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    log.info("contentsvc_stopped")
    return exit_code
