"""A fold that fails (projectors/faults.py), run by the real runner on a real PostgreSQL.

A step that raises anything but a lost database stops that fold where it is: nothing is skipped,
the process stays up and retries with backoff one event at a time, so the events before the
failing one are folded and the recorded fault names that one event; `projector status` shows
it; the first step past it clears it. The same holds for an event whose payload does not decode
as its kind's (one written by a newer release, or by hand).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from contextlib import asynccontextmanager
from typing import AsyncIterator

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from structlog.testing import capture_logs

from contentsvc.journal import checkpoints
from contentsvc.journal.events import UPLOAD_FAILED, JournalEvent
from contentsvc.logging import describe_exception
from contentsvc.operator.projectors import print_status
from contentsvc.operator.workers import print_worker_status
from contentsvc.projectors.base import Projector, TableFold
from contentsvc.projectors.runner import run
from tests.conftest import status_table_rows, until_async
from tests.integration.plugin_processes import CONTENTSVC
from tests.integration.test_projector_contract import (FailedUploadsIndexed, FailedUploadsTally, append_events, head,
                                                       received_upload, tally_counts, tally_database)


def quoted_value(position: int) -> str:
    """A value a database error quotes (made at run time: a traceback shows the source's lines)."""
    return f"stored-value-{position * 7919}"


class PoisonedTally(TableFold):
    """Writes each event's position into `tally`, and fails on the positions in `poisoned`."""

    name = "tally"
    batch_size = 25

    def __init__(self, quoting_database_error: bool = False) -> None:
        self.poisoned: set[int] = set()
        self.quoting_database_error = quoting_database_error
        self.batches: list[int] = []  # the size of each batch applied, failed ones included

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        self.batches.append(len(events))
        await conn.execute("INSERT INTO tally (position) SELECT unnest(%s::bigint[])", ([e.position for e in events],))
        bad = self.poisoned.intersection(e.position for e in events)
        if bad and self.quoting_database_error:  # PostgreSQL's words quote the value
            await (await conn.execute("SELECT %s::text::int", (quoted_value(min(bad)),))).fetchone()
        if bad:
            raise ValueError(f"cannot fold position {min(bad)}")


@pytest.fixture
def url(databases) -> str:
    return tally_database(databases)


def positions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT position FROM journal ORDER BY position")]


def fault_row(url: str) -> tuple | None:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT error, message, first_position, last_position, kind, attempts"
                            " FROM projector_faults WHERE name = 'tally'").fetchone()


@asynccontextmanager
async def running(url: str, projector: Projector, **options) -> AsyncIterator[asyncio.Task]:
    """The real runner folding with `projector` until the block ends (short retries by default)."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(url, projector, stop=stop, **{
        "poll_seconds": 0.1, "fault_retry_first_seconds": 0.05, **options}))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def cleared_and_caught_up(url: str, through: int) -> None:
    await until_async(lambda: fault_row(url) is None, "the fault is cleared")
    await until_async(lambda: checkpoint(url) == through, "the fold catches up")


def checkpoint(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT position FROM projector_checkpoints WHERE name = 'tally'").fetchone()
        return row[0] if row else 0


def status_text(url: str, tmp_path, capsys) -> str:
    assert print_status(url, ["tally"], tmp_path) == 0
    out = capsys.readouterr().out
    assert [row["projector"] for row in status_table_rows(out)] == ["tally"]  # the faults table is its own
    return re.sub(r"\s+", " ", out)


def test_a_failing_event_stops_its_fold_there_and_is_named_until_a_step_gets_past_it(url, tmp_path, capsys):
    # docs/decisions.md "Projector faults": nothing is skipped, the operator is told which event
    asyncio.run(append_events(url, 60))
    journal = positions(url)
    poison = journal[39]  # in the second batch of 25
    projector = PoisonedTally()
    projector.poisoned = {poison}

    async def scenario() -> None:
        async with running(url, projector) as task:
            # Retried one event at a time, the fault narrows to the poisoned event; the ones before it are folded.
            row = await until_async(lambda: (r := fault_row(url)) and r[2] == r[3] and r, "the fault names one event")
            assert row[:5] == ("ValueError", f"cannot fold position {poison}", poison, poison, "upload.failed")
            assert (await tally_counts(url))[1:] == (39, journal[38])
            assert not task.done()  # the runner stays up and keeps its place
            attempts = row[5]
            await until_async(lambda: fault_row(url)[5] > attempts, "it retries")
            status = status_text(url, tmp_path, capsys)
            assert "tally │ yes" in status and f"position {poison} (upload.failed)" in status, status
            assert "ValueError: cannot fold" in status, status
            assert print_status(url, ["tally"], tmp_path, as_json=True) == 0
            document = json.loads(capsys.readouterr().out)
            assert document["projectors"][0]["running"] and document["projectors"][0]["lag"] == 60 - 39
            [fault] = document["faults"]
            assert {k: fault[k] for k in ("name", "error", "first_position", "last_position", "kind")} == {
                "name": "tally", "error": "ValueError", "first_position": poison, "last_position": poison,
                "kind": "upload.failed"} and fault["attempts"] >= 2, fault

            projector.poisoned.clear()  # the cause is fixed: the next attempt gets past it
            await cleared_and_caught_up(url, journal[-1])
            assert projector.isolating_from is None

    with capture_logs() as logs:
        asyncio.run(scenario())
    # Every event folded once: each failing step's rows were rolled back with it.
    assert asyncio.run(tally_counts(url)) == (60, 60, journal[-1])
    events = [entry["event"] for entry in logs]
    assert events.count("projector_faulted") == 1 and events.count("projector_fault_cleared") == 1, events
    first = next(e for e in logs if e["event"] == "projector_faulted")
    assert first["exc_info"] and first["position"] == journal[25] and first["through"] == journal[49]
    assert all("exc_info" not in e for e in logs if e["event"] == "projector_fault_persists")
    assert "faults" not in status_text(url, tmp_path, capsys)


def test_a_database_error_is_recorded_by_its_type_and_sqlstate_never_by_the_value_it_quotes(url):
    # README "Logs": a database error is logged by its type and SQLSTATE; a fault is stored alike
    asyncio.run(append_events(url, 3))
    journal = positions(url)
    projector = PoisonedTally(quoting_database_error=True)
    projector.poisoned = {journal[1]}

    async def scenario() -> None:
        async with running(url, projector):
            row = await until_async(lambda: (r := fault_row(url)) and r[2] == r[3] and r, "the fault names one event")
            assert row[:5] == ("InvalidTextRepresentation", "sqlstate 22P02", journal[1], journal[1], "upload.failed")
            projector.poisoned.clear()
            await cleared_and_caught_up(url, journal[-1])

    with capture_logs() as logs:
        asyncio.run(scenario())
    faulted = [e for e in logs if e["event"] in ("projector_faulted", "projector_fault_persists")]
    assert faulted and all(e["message"] == "sqlstate 22P02" for e in faulted), faulted
    [traced] = [e for e in faulted if "exc_info" in e]  # rendered as the log's `exception` field
    assert quoted_value(journal[1]) not in describe_exception(traced["exc_info"])


def rewrite_payload(conn: psycopg.Connection, position: int, payload: dict) -> None:
    conn.execute("SET session_replication_role = replica")
    conn.execute("UPDATE journal SET payload = %s WHERE position = %s", (Jsonb(payload), position))


def test_an_event_that_does_not_decode_is_named_and_folded_once_it_does(url):
    asyncio.run(append_events(url, 10))
    journal = positions(url)
    bad = journal[4]
    with psycopg.connect(url, autocommit=True) as conn:
        good = conn.execute("SELECT payload FROM journal WHERE position = %s", (bad,)).fetchone()[0]
        # As a newer release (or a hand) might have written it: the kind's required members are
        # missing. The journal refuses changes; its trigger is bypassed to write it.
        rewrite_payload(conn, bad, {"upload": 1})

    async def scenario() -> None:
        async with running(url, PoisonedTally()):
            row = await until_async(lambda: fault_row(url), "the fault is recorded")
            assert row[0] == "UndecodableEvent" and row[2:5] == (bad, bad, "upload.failed"), row
            assert f"upload.failed event at position {bad} does not decode" in row[1]
            # Named at once (the reader knows the position); the events before it are folded next.
            await until_async(lambda: checkpoint(url) == journal[3], "the events before it are folded")
            await until_async(lambda: fault_row(url)[5] > row[5], "it retries")
            assert checkpoint(url) == journal[3] and fault_row(url)[:5] == row[:5]
            with psycopg.connect(url, autocommit=True) as conn:  # as a release that reads it would
                rewrite_payload(conn, bad, good)
            await cleared_and_caught_up(url, journal[-1])

    asyncio.run(scenario())
    assert asyncio.run(tally_counts(url)) == (10, 10, journal[-1])


def test_a_fault_recorded_before_a_start_is_cleared_by_the_first_step_past_it(url):
    # A fold that starts (or reopens) before a fault's events goes at full batches up to them, then
    # takes them one at a time, then full batches again once past them.
    asyncio.run(append_events(url, 60))
    journal = positions(url)
    with psycopg.connect(url, autocommit=True) as conn:  # left by a process stopped while faulted
        conn.execute("INSERT INTO projector_faults (name, error, message, first_position, last_position, kind)"
                     " VALUES ('tally', 'ValueError', 'an old defect', %s, %s, 'upload.failed')",
                     (journal[29], journal[29]))
    projector = PoisonedTally()

    async def scenario() -> None:
        async with running(url, projector):
            await cleared_and_caught_up(url, journal[-1])

    asyncio.run(scenario())
    assert asyncio.run(tally_counts(url)) == (60, 60, journal[-1])
    assert projector.batches == [25, 4, 1, 25, 5]


class FlakyWorker(Projector):
    """A worker (no journal) whose steps fail and succeed in turn, `failures` times, as one whose
    call in flight keeps getting an unusable answer: a step between two failures succeeds."""

    name = "tally"
    wakes_on = ()

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.steps = 0

    async def step(self, conn: AsyncConnection) -> bool:
        self.steps += 1
        if self.failures and self.steps % 2:
            self.failures -= 1
            raise RuntimeError("the answer cannot be stored")
        return False


def test_a_worker_fault_on_no_event_is_cleared_only_once_its_steps_keep_succeeding(url, capsys):
    # A step that succeeds between two failures does not clear the fault: one traceback, one row
    # whose attempts grow, and the backoff grows with them. (Settled after 3 s here, not a minute:
    # far above the few milliseconds between a retry and the next failure, even on a loaded machine.)
    async def scenario() -> None:
        async with running(url, FlakyWorker(failures=4), poll_seconds=0.02, fault_retry_first_seconds=0.02,
                           fault_settled_seconds=3.0):
            row = await until_async(lambda: (r := fault_row(url)) and r[5] == 4 and r, "four attempts")
            assert row[:5] == ("RuntimeError", "the answer cannot be stored", None, None, None)
            assert print_worker_status(url, {"tally": FlakyWorker}, as_json=True) == 0
            document = json.loads(capsys.readouterr().out)
            assert document["workers"] == [{"name": "tally", "position": None, "lag": None, "waiting": None,
                                            "running": True}]
            assert [(f["name"], f["first_position"], f["attempts"]) for f in document["faults"]] == [("tally", None, 4)]
            await until_async(lambda: fault_row(url) is None, "the fault is cleared")

    with capture_logs() as logs:
        asyncio.run(scenario())
    events = [entry["event"] for entry in logs]
    assert events.count("projector_faulted") == 1 and events.count("projector_fault_persists") == 3, events
    assert events.count("projector_fault_cleared") == 1 and events[-1] == "projector_fault_cleared", events


def test_a_replay_reaching_an_event_that_does_not_decode_names_it_and_changes_nothing(url, tmp_path):
    # docs/decisions.md "Projector faults": the operator's replay says which event, in one line, exit 1
    asyncio.run(append_events(url, 3))
    bad = positions(url)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        rewrite_payload(conn, bad, {"upload": 1})
    env = {**os.environ, "CONTENTSVC_DATABASE_URL": url, "CONTENTSVC_HOME": str(tmp_path)}
    env.pop("CONTENTSVC_CONFIG", None)
    out = subprocess.run([*CONTENTSVC, "projector", "replay", "readmodel"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 1, out.stderr
    assert out.stderr.splitlines()[-1].startswith(
        f"error: the payload of the upload.failed event at position {bad} does not decode:"), out.stderr
    assert "Traceback" not in out.stderr
    with psycopg.connect(url) as conn:  # the replay's one transaction rolled back
        assert conn.execute("SELECT position FROM projector_checkpoints WHERE name = 'readmodel'").fetchone() is None


@pytest.mark.parametrize("fold", [FailedUploadsTally, FailedUploadsIndexed])
def test_a_fold_reading_a_few_kinds_isolates_a_fault_the_same_way(url, fold):
    # Projector.batch_bounds with next_batch's sparse scan: up to just before the fault's event,
    # that event alone, then on; every event it reads folded once, the others passed.
    async def scenario():
        await append_events(url, 10)
        await append_events(url, 60, received_upload)
        await append_events(url, 30)
        await append_events(url, 3, received_upload)
        async with await AsyncConnection.connect(url) as conn:
            cur = await conn.execute("SELECT position FROM journal WHERE kind = %s ORDER BY position", (UPLOAD_FAILED,))
            failed = [r[0] for r in await cur.fetchall()]
            projector = fold()
            projector.isolating_from = failed[24]  # as the runner sets it after a failure there
            await projector.open(conn)
            reached = []
            while await projector.step(conn):
                reached.append(await checkpoints.position(conn, projector.name))
                assert len(reached) < 20
            reached.append(await checkpoints.position(conn, projector.name))
            folded = (await (await conn.execute("SELECT array_agg(position ORDER BY position) FROM tally")).fetchone())[0]
            return failed, folded, reached, await head(conn)

    failed, folded, reached, last = asyncio.run(scenario())
    assert folded == failed and reached[-1] == last
    assert failed[24] - 1 in reached and reached[reached.index(failed[24] - 1) + 1] == failed[24], reached


def test_a_fault_bound_past_the_journal_head_never_moves_the_checkpoint_past_it(url):
    # next_batch reads the head before the events: a bound beyond it (a fault row naming a
    # position no event holds yet) must not let the checkpoint skip the events appended later.
    asyncio.run(append_events(url, 5))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO projector_faults (name, error, message, first_position, last_position)"
                     " VALUES ('tally', 'ValueError', 'a stray row', 1000000, 1000000)")

    async def scenario() -> None:
        async with running(url, PoisonedTally()):
            await until_async(lambda: checkpoint(url) == positions(url)[-1], "the fold reaches the head")
            await append_events(url, 5)
            await until_async(lambda: checkpoint(url) == positions(url)[-1], "the fold folds what came after")

    asyncio.run(scenario())
    assert asyncio.run(tally_counts(url)) == (10, 10, positions(url)[-1])
