"""The embedded PostgreSQL under CONTENTSVC_HOME/pgdata (the pgserver package, a real server).

pgserver counts the processes using a data directory in pgdata/.handle_pids.json
and stops the server when the last of them exits normally. A process that is
killed never removes its pid, and then no later process is ever the last one:
so dead pids are dropped before joining, and the process that owns the home
(`run`, `serve`) stops the server itself when it ends, whatever the count says.
The server's own log is pgdata/log, never this process's stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from contentsvc.logging import get_logger

log = get_logger("contentsvc.storage.embedded")

PGDATA = "pgdata"
HANDLE_PIDS = ".handle_pids.json"

_servers: dict[Path, object] = {}


def pgdata_of(home: Path) -> Path:
    return home / PGDATA


def exists(home: Path) -> bool:
    """Whether an embedded database was ever created under home."""
    return (pgdata_of(home) / "PG_VERSION").exists()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_dead_handles(pgdata: Path) -> None:
    """Removes the pids of processes that died without saying so (a crash, SIGKILL)."""
    import pgserver.postgres_server as pgs

    path = pgdata / HANDLE_PIDS
    with pgs.PostgresServer._lock:
        try:
            pids = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        alive = [pid for pid in pids if isinstance(pid, int) and _pid_alive(pid)]
        if alive != pids:
            path.write_text(json.dumps(alive))
            log.info("embedded_postgres_stale_handles_removed", pids=[pid for pid in pids if pid not in alive])


def _already_running(pgdata: Path) -> bool:
    """Whether a server runs on pgdata already (another process of this home started it), as pgserver
    decides whether to start one."""
    from pgserver.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, IndexError):
        return False
    return info is not None and info.is_running()


def start(home: Path):
    """Start (or join) the embedded PostgreSQL under home/pgdata; its pgserver handle."""
    import logging
    import warnings

    # pgserver's import has platformdirs warn that XDG_RUNTIME_DIR is unset: nothing an operator does.
    warnings.filterwarnings("ignore", module="platformdirs")
    # pgserver's INFO lines are initdb chatter, and its ERROR lines paste the server's own log
    # (which quotes values): our own lines say what failed.
    logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    import pgserver  # imported lazily: only the embedded path needs it

    home = home.expanduser().resolve()
    if home in _servers:
        return _servers[home]
    home.mkdir(parents=True, exist_ok=True)
    pgdata = pgdata_of(home)
    running = False
    if pgdata.exists():
        _drop_dead_handles(pgdata)
        running = _already_running(pgdata)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    _servers[home] = server
    # A command run beside `contentsvc run` shares its server: "started" would read as a second one.
    log.info("embedded_postgres_joined" if running else "embedded_postgres_started", pgdata=str(pgdata),
             pid=server.get_pid())
    return server


def postmaster_alive(server) -> bool:
    info = server.get_postmaster_info()
    import psutil

    try:
        return info.process is not None and info.process.is_running() and info.process.status() != "zombie"
    except psutil.Error:
        return False


def _drop_dead_postmaster_pid(pgdata: Path) -> None:
    """A postmaster that was killed leaves postmaster.pid behind; while its process is an unreaped
    zombie, PostgreSQL takes the pid for a live server and refuses to start. The file of a dead
    postmaster goes (its shared memory stays interlocked until the old backends are gone)."""
    import psutil

    path = pgdata / "postmaster.pid"
    try:
        pid = int(path.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        dead = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        dead = True
    if dead:
        path.unlink(missing_ok=True)


def restart(server) -> bool:
    """Starts the server of that handle again (same data directory, same socket, so the same URL);
    whether it runs. A killed postmaster's backends may hold its shared memory for a moment:
    the caller retries."""
    import pgserver.postgres_server as pgs

    try:
        with pgs.PostgresServer._lock:
            _drop_dead_postmaster_pid(server.pgdata)
            server.ensure_postgres_running()
    except (subprocess.SubprocessError, AssertionError, OSError) as exc:
        log.debug("embedded_postgres_restart_failed", error=type(exc).__name__)
        return False
    return postmaster_alive(server)


def stop(server, timeout: float = 3.0) -> None:
    """Stops the server whoever else joined it: the home's owner is ending. A fast shutdown
    (clients disconnected, a shutdown checkpoint) for `timeout` seconds, then an immediate one
    (the next start recovers from the WAL), then SIGKILL: bounded, so that a whole stop fits
    the 10 s an operator is promised."""
    import pgserver.postgres_server as pgs
    from pgserver._commands import pg_ctl

    process = server.get_postmaster_info().process
    with pgs.PostgresServer._lock:
        server.global_process_id_list.put([])
    for mode, seconds in (("fast", timeout), ("immediate", 2.0)):
        if not postmaster_alive(server):
            break
        try:
            pg_ctl(["-w", "-t", str(max(1, int(seconds))), "-m", mode, "stop"], pgdata=server.pgdata,
                   user=server.system_user, timeout=seconds + 2)
        except (subprocess.SubprocessError, OSError):
            pass
    deadline = time.monotonic() + 1
    while postmaster_alive(server) and time.monotonic() < deadline:
        process.kill()
        time.sleep(0.1)
    for home, handle in list(_servers.items()):
        if handle is server:
            del _servers[home]
    log.info("embedded_postgres_stopped", pgdata=str(server.pgdata))
