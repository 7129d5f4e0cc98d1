"""`contentsvc worker status`: whether each worker runs and the work waiting for it.

Workers keep their queues in tables of their own (a webhook waits in `deliveries`, a Connector
run in `connector_runs`), not as a journal position, so the projectors' lag says nothing about
them: a destination that is down shows here as Deliveries due and late, a plugin that does not
answer as contract checks waiting. Each worker says what waits in its own tables (`waiting`,
beside the code that drains them); this module only gathers the table.
"""

from __future__ import annotations

import json

import psycopg
from rich.console import Console
from rich.table import Table

from contentsvc.operator.projectors import checkpoints_by_name, head_position, held_locks, print_faults
from contentsvc.projectors.base import Projector
from contentsvc.projectors.faults import faults_of
from contentsvc.projectors.runner import instance_lock_id, runner_application_name


def worker_status(url: str, workers: dict[str, type[Projector]]) -> dict:
    """What `worker status` shows, as one JSON-ready object: for `workers`, each name with its
    class, in the process registry's order, whether it runs (its lock, or for a worker sharing its
    work by row leases, its connections) and what waits in its tables, which each worker's
    `waiting` reads."""
    with psycopg.connect(url) as conn:
        head = head_position(conn)
        checkpoints = checkpoints_by_name(conn)
        held = held_locks(conn)
        # The runners' connections, by application (one per process): the only sign of a worker
        # that shares its work by row leases and so holds no single-instance lock (deliveries).
        connected = dict(conn.execute("SELECT application_name, count(*) FROM pg_stat_activity"
                                      " WHERE datname = current_database() GROUP BY 1").fetchall())
        waiting = {name: worker.waiting(conn) for name, worker in workers.items()}
        faults = faults_of(conn, workers)
    rows = []
    for name, worker in workers.items():
        position = checkpoints.get(name, (None,))[0]  # a worker folding the journal keeps a checkpoint
        row = {"name": name, "position": position, "lag": None if position is None else head - position,
               "waiting": waiting[name]}
        if worker.single_instance:
            row["running"] = instance_lock_id(name) in held
        else:
            row["processes"] = connected.get(runner_application_name(name), 0)
            row["running"] = row["processes"] > 0
        rows.append(row)
    return {"journal_head": head, "workers": rows, "faults": faults}


def print_worker_status(url: str, workers: dict[str, type[Projector]], as_json: bool = False) -> int:
    status = worker_status(url, workers)
    if as_json:
        print(json.dumps(status))
        return 0
    table = Table(title=f"journal head {status['journal_head']}")
    for column in ("worker", "running", "position", "lag (events)", "waiting"):
        table.add_column(column)
    for w in status["workers"]:
        processes = w.get("processes")
        if processes is not None:
            running = f"yes ({processes} process{'es' if processes > 1 else ''})" if processes else "no"
        else:
            running = "yes" if w["running"] else "no"
        table.add_row(w["name"], running, "-" if w["position"] is None else str(w["position"]),
                      "-" if w["lag"] is None else str(w["lag"]), w["waiting"] or "-")
    console = Console(width=max(Console().width, 140))
    console.print(table)
    print_faults(console, status["faults"])
    return 0
