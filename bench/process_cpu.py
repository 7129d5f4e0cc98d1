"""CPU seconds per process over a phase of a bench: where the cores went.

Counted for the processes of a service the bench started (`contentsvc run` and its children, by
role: `api`, `projector:lexical`, `worker:gc` ...), for the bench's own process, and for the
PostgreSQL server's processes when that server runs on this machine: its backends by the
`application_name` of their connection without its `contentsvc ` (`postgres: api`, `postgres:
projector lexical`), its background processes by type (`postgres: walwriter` ...).

A snapshot reads each process's cumulative user + system time; a phase's figure is the
difference between the snapshots around its load (`counted`: the requests being sent, not the
drain after them). A process started during the phase counts whole; one that ended during it is
lost, and counted in `ended_processes`.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil
import psycopg

from contentsvc.processes.children import role_of


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def service_role(argv: list[str]) -> str:
    """The name the supervisor gives a process of the service (`api`, `projector:lexical`,
    `supervisor`, processes/children.py); any other program by its name."""
    return role_of(argv) or (Path(argv[0]).name if argv else "?")


Snapshot = dict[int, tuple[str, float]]  # pid -> (label, cumulative CPU seconds)


class CpuAccount:
    """Snapshots of the service's, the bench's and the local PostgreSQL's processes."""

    def __init__(self, supervisor_pid: int | None, database_url: str | None) -> None:
        self.supervisor_pid = supervisor_pid
        self.conn = psycopg.connect(database_url, autocommit=True) if database_url else None
        self.postgres_is_local = self.conn is not None and self._backend_is_local()

    def _backend_is_local(self) -> bool:
        """Whether our own backend's pid is a PostgreSQL process of this machine (not a server
        elsewhere, or in a container, whose pids mean nothing here)."""
        pid = self.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        try:
            return "postgres" in " ".join(psutil.Process(pid).cmdline())
        except psutil.Error:
            return False

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def _labelled(self) -> dict[int, str]:
        labels = {psutil.Process().pid: "bench client"}
        if self.supervisor_pid:
            try:
                supervisor = psutil.Process(self.supervisor_pid)
                labels[supervisor.pid] = "supervisor"
                for child in supervisor.children(recursive=True):
                    labels[child.pid] = service_role(child.cmdline())
            except psutil.Error:
                pass  # the service ended: its processes are not counted
        if self.postgres_is_local:
            rows = self.conn.execute(
                "SELECT pid, coalesce(nullif(application_name, ''), backend_type) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid()").fetchall()
            labels.update({pid: f"postgres: {name.removeprefix('contentsvc ')}" for pid, name in rows})
        return labels

    def snapshot(self) -> Snapshot:
        shot: Snapshot = {}
        for pid, label in self._labelled().items():
            try:
                shot[pid] = (label, _cpu_seconds(psutil.Process(pid)))
            except psutil.Error:
                continue  # ended meanwhile
        return shot

    def since(self, before: Snapshot) -> dict[str, object]:
        """CPU seconds per label from `before` to now, the largest first, with their total."""
        now = self.snapshot()
        by_label: dict[str, float] = {}
        for pid, (label, seconds) in now.items():
            earlier = before.get(pid)
            by_label[label] = by_label.get(label, 0.0) + seconds - (earlier[1] if earlier else 0.0)
        ordered = dict(sorted(((k, round(v, 2)) for k, v in by_label.items() if v >= 0.005), key=lambda kv: -kv[1]))
        return {"total": round(sum(by_label.values()), 2), "by_process": ordered,
                "ended_processes": len(set(before) - set(now)),
                "postgres_counted": self.postgres_is_local}


@contextmanager
def counted(account: CpuAccount | None) -> Iterator[dict[str, object]]:
    """The CPU seconds of the block (CpuAccount.since), filled in when it ends; empty without an
    account."""
    figures: dict[str, object] = {}
    before = account.snapshot() if account else None
    yield figures
    if account:
        figures.update(account.since(before))


def busiest(figures: dict[str, object], count: int = 7) -> str:
    """The `count` processes that took the most of a phase's CPU, for a summary line."""
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in list(figures["by_process"].items())[:count]
                     if seconds >= 0.05)
