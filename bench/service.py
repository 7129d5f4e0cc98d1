"""The service under test: one the bench starts on a fresh database (as the tests start
one), or one already running; a client for it; and what its log said during the run."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import psycopg
from contentsvc.bench.driver import BenchError

from contentsvc.config import current_settings
from contentsvc.processes.children import supervised_children
from contentsvc.processes.local_service import (
    LocalService,
    create_database,
    drop_database,
)
from contentsvc.processes.registry import PROJECTOR, WORKER

JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class Target:
    base_url: str
    api_key: str
    database_url: str | None
    own: bool
    supervisor_pid: int | None = None  # `contentsvc run`, when the bench started it


class OwnService:
    """A fresh database (on CONTENTSVC_DATABASE_URL's server, else CONTENTSVC_TEST_DATABASE_URL's,
    else an embedded PostgreSQL) and `contentsvc run` on it, as the tests start one."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.admin_url: str | None = None
        self.database_url: str | None = None
        self.service: LocalService | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._embedded = None  # the embedded PostgreSQL this started, if any
        self._home = tempfile.TemporaryDirectory(prefix="contentsvc-bench-home-")

    @property
    def process(self):
        return self.service.process

    def _admin(self) -> str:
        settings = current_settings()
        url = settings.database_url or settings.bench.admin_database_url
        if url:
            return url
        from contentsvc.storage import embedded

        self._tmp = tempfile.TemporaryDirectory(prefix="contentsvc-bench-pg-")
        self._embedded = embedded.start(Path(self._tmp.name))
        return self._embedded.get_uri()

    def start(self, home: Path | None = None, extra_env: dict[str, str] | None = None) -> Target:
        print(f"[bench] starting contentsvc (log: {self.log_path}) ...", file=sys.stderr, flush=True)
        self.admin_url = self._admin()
        self.database_url = create_database(self.admin_url, "csbench")
        try:
            self.service = LocalService(self.database_url, self.log_path, home or Path(self._home.name), extra_env)
        except RuntimeError as exc:
            raise BenchError(str(exc)) from None

        from contentsvc.auth import keys

        with psycopg.connect(self.database_url, autocommit=True) as conn:
            created = keys.create_key(conn, f"bench-{uuid.uuid4().hex[:8]}", keys.parse_actions("*"), None, "bench")
        return Target(self.service.base_url, created.secret, self.database_url, own=True,
                      supervisor_pid=self.service.process.pid)

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()
        if self.database_url and self.admin_url:
            try:
                drop_database(self.admin_url, self.database_url)
            except psycopg.Error as exc:
                print(f"warning: could not drop database {self.database_url}: {exc}", file=sys.stderr)
            self.database_url = None
        if self._tmp is not None:
            from contentsvc.storage import embedded

            embedded.stop(self._embedded)  # before its files go (tests/conftest.py admin_url says why)
            self._tmp.cleanup()
            self._tmp = self._embedded = None
        self._home.cleanup()


PAUSE_ATTEMPTS = 100  # times the folds are stopped, at most, before one is found outside a transaction


@contextmanager
def folds_paused(target: Target, pause: bool = True):
    """Every projector and worker of a service the bench started stopped (SIGSTOP) for the
    block, resumed after: what the API alone reaches with the cores to itself, a reference
    beside the same phase with the folds running. Yields how many were stopped; with `pause`
    false, stops nothing and yields None (the phase itself)."""
    if not pause:
        yield None
        return
    pids = ([child.pid for role, child in supervised_children(target.supervisor_pid).items()
             if role.partition(":")[0] in (PROJECTOR, WORKER)] if target.supervisor_pid else [])

    def signal_all(signum: int) -> None:
        for pid in pids:
            os.kill(pid, signum)

    # A fold stopped inside a transaction would hold what it locked (the journal lock, during
    # its own append) for the whole phase, and every ingest would wait for it until its lock
    # timeout (one run: 80 answers 503, then 429 as the backlog aged): resumed and stopped
    # again until none is inside one, a bounded number of times.
    with ExitStack() as opened:
        conn = (opened.enter_context(psycopg.connect(target.database_url, autocommit=True))
                if pids and target.database_url else None)
        for _ in range(PAUSE_ATTEMPTS):
            signal_all(signal.SIGSTOP)
            if conn is None or not _folds_in_transaction(conn):
                break
            signal_all(signal.SIGCONT)
            time.sleep(0.02)
    try:
        yield len(pids)
    finally:
        signal_all(signal.SIGCONT)


def _folds_in_transaction(conn: psycopg.Connection) -> bool:
    """Whether a connection of the service other than the API's is inside a transaction."""
    return conn.execute(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE 'contentsvc %%' AND application_name NOT LIKE 'contentsvc api%%'"
        " AND xact_start IS NOT NULL)").fetchone()[0]


def api_client(target: Target, connections: int = 100, timeout: float = 30.0) -> httpx.AsyncClient:
    """Keep-alive HTTP/1.1 with the run's key, at most `connections` at once."""
    return httpx.AsyncClient(
        base_url=target.base_url,
        headers={"Authorization": f"Bearer {target.api_key}"},
        timeout=httpx.Timeout(timeout),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        http1=True, http2=False,
    )


async def create_corpus(client: httpx.AsyncClient, corpus_id: str, name: str | None = None) -> str:
    r = await client.post("/v0/corpora", content=msgspec.json.encode(
        {"idempotency_key": uuid.uuid4().hex, "corpus_id": corpus_id, "name": name or f"bench {corpus_id}"}),
        headers=JSON_HEADERS)
    if r.status_code not in (200, 201):
        raise BenchError(f"createCorpus {corpus_id}: {r.status_code} {r.text[:500]}")
    return r.json()["corpus_id"]


async def folds_caught_up(conn: psycopg.AsyncConnection, cap_s: float) -> None:
    """Until every fold (the serving index generations' included) has caught up with the journal
    as it is now: a phase then runs on a quiet service instead of paying for the indexing and
    embedding the one before left behind it."""
    head = (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]
    deadline = time.perf_counter() + cap_s
    while True:
        cur = await conn.execute(
            "SELECT count(*) FROM projector_checkpoints c WHERE c.position < %s AND (c.name NOT LIKE '%%:%%'"
            " OR EXISTS (SELECT 1 FROM search_generations g WHERE g.state = 'serving'"
            "            AND c.name = g.kind || ':' || g.generation_id))", (head,))
        if (await cur.fetchone())[0] == 0:
            return
        if time.perf_counter() > deadline:
            raise BenchError(f"the folds had not caught up with journal position {head} after {cap_s} s")
        await asyncio.sleep(0.1)


def scan_server_log(path: Path) -> dict[str, Any]:
    """Warnings, errors and tracebacks the service wrote during the run."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {"path": str(path), "lines": 0}
    levels: Counter[str] = Counter()
    events: Counter[str] = Counter()
    excerpt = []
    tracebacks = 0
    for line in lines:
        level = None
        if line.startswith("{"):
            try:
                rec = json.loads(line)
                level = rec.get("level")
                if level in ("warning", "error", "critical", "exception"):
                    events[f"{level}:{rec.get('event')}"] += 1
            except ValueError:
                pass
        elif "Traceback" in line:
            tracebacks += 1
            level = "traceback"
        elif any(w in line for w in ("ERROR", "Error", "Exception")):
            level = "error_text"
        if level:
            levels[level] += 1
            if level not in ("info", "debug") and len(excerpt) < 30:
                excerpt.append(line[:400])
    return {"path": str(path), "lines": len(lines), "by_level": dict(levels), "tracebacks": tracebacks,
            "warning_and_error_events": dict(events), "excerpt": excerpt}
