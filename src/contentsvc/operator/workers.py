"""`contentsvc worker status`: whether each worker runs and the work waiting for it.

Workers keep their queues in tables of their own (a webhook waits in `deliveries`, a Connector
run in `connector_runs`), not as a journal position, so the projectors' lag says nothing about
them: a destination that is down shows here as Deliveries due and late, a plugin that does not
answer as contract checks waiting.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
from rich.console import Console
from rich.table import Table

from contentsvc.operator.projectors import checkpoints_by_name, head_position, held_locks
from contentsvc.projectors.runner import instance_lock_id, runner_application_name


def _counted(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def _ago(delay: timedelta | None) -> str:
    return "" if delay is None else f", the oldest due {max(0, round(delay.total_seconds())):,} s ago"


def _monitor(conn: psycopg.Connection) -> str:
    # The table holds only the evaluations still to decide (schema/031).
    pending, due, late = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE next_attempt_at <= now()),"
        " now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now()) FROM monitor_evaluations").fetchone()
    return f"{_counted(pending, 'evaluation')} pending ({due:,} due{_ago(late)})"


def _deliveries(conn: psycopg.Connection) -> str:
    # A held Delivery (its Subscription disabled or deleted, its destination unconfigured) waits
    # for no worker: it is counted apart from the ones the workers will attempt.
    pending, due, held, late = conn.execute(
        "SELECT count(*) FILTER (WHERE held IS NULL), count(*) FILTER (WHERE held IS NULL AND next_attempt_at <= now()),"
        " count(*) FILTER (WHERE held IS NOT NULL),"
        " now() - min(next_attempt_at) FILTER (WHERE held IS NULL AND next_attempt_at <= now())"
        " FROM deliveries WHERE state = 'pending'").fetchone()
    return f"{_counted(pending, 'delivery', 'deliveries')} pending ({due:,} due{_ago(late)}), {held:,} held"


def _connectors(conn: psycopg.Connection) -> str:
    queued, running, late = conn.execute(
        "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'running'),"
        " now() - min(run_at) FILTER (WHERE state = 'queued' AND run_at <= now())"
        " FROM connector_runs WHERE state IN ('queued', 'running')").fetchone()
    return f"{_counted(queued, 'run')} queued{_ago(late)}, {running:,} running"


def _plugins(conn: psycopg.Connection) -> str:
    waiting = conn.execute("SELECT count(*) FROM plugin_registrations WHERE check_report IS NULL").fetchone()[0]
    return f"{_counted(waiting, 'contract check')} waiting"


# What each worker's queue holds; a worker absent here (gc) works on a timer, not a queue.
WAITING = {"monitor": _monitor, "deliveries": _deliveries, "connectors": _connectors, "plugins": _plugins}


def print_worker_status(url: str, workers: dict[str, bool]) -> int:
    """The table of `workers`: each name with whether its processes share the work by row leases
    (and so hold no single-instance lock), in the process registry's order."""
    with psycopg.connect(url) as conn:
        head = head_position(conn)
        checkpoints = checkpoints_by_name(conn)
        held = held_locks(conn)
        # The runners' connections, by application (one per process): the only sign of a worker
        # that shares its work by row leases and so holds no single-instance lock (deliveries).
        connected = dict(conn.execute("SELECT application_name, count(*) FROM pg_stat_activity"
                                      " WHERE datname = current_database() GROUP BY 1").fetchall())
        waiting = {name: WAITING[name](conn) if name in WAITING else "-" for name in workers}
    table = Table(title=f"journal head {head}")
    for column in ("worker", "running", "position", "lag (events)", "waiting"):
        table.add_column(column)
    for name, shares_work in workers.items():
        if shares_work:
            processes = connected.get(runner_application_name(name), 0)
            running = f"yes ({processes} process{'es' if processes > 1 else ''})" if processes else "no"
        else:
            running = "yes" if instance_lock_id(name) in held else "no"
        position = checkpoints.get(name, (None,))[0]  # a worker folding the journal keeps a checkpoint
        table.add_row(name, running, "-" if position is None else str(position),
                      "-" if position is None else str(head - position), waiting[name])
    Console(width=max(Console().width, 140)).print(table)
    return 0
