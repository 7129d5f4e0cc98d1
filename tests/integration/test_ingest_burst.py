"""A fold behind a burst of ingests rests between its steps, on a real PostgreSQL
(projectors/runner.py IngestBurst, docs/decisions.md "Folds rest in bursts of ingests").

- While it is behind and withdrawals keep being appended (real `withdrawal.accepted` events,
  announced by the journal's own NOTIFY), the fold rests, and still folds every event exactly
  once; when they stop it catches up and says so (`projector_rested`, `caught_up`).
- Past its burst time it folds on without resting although they keep coming
  (`burst_time_spent`): a load it cannot keep up with at a fraction of its speed is not starved.
- With `ingest_burst_seconds` 0 it never rests.
- A fold with a `contended_batch_size` reads that many positions per step while ingests arrive,
  its full batch otherwise.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Callable

import pytest
from psycopg import AsyncConnection
from structlog.testing import capture_logs

from contentsvc.journal.events import JournalEvent, NewEvent, Source, WithdrawalAccepted
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.projectors.runner import IngestBurst, run
from tests.integration.test_projector_contract import Tally, append_events, head, tally_counts, tally_database


async def append_withdrawals(url: str, count: int, every_seconds: float) -> None:
    """`count` withdrawals, one transaction each, as the API appends them under a burst."""
    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(count):
            receipt_id = f"rcp_{uuid.uuid4().hex}"
            event = NewEvent(org_id="burst", corpus_id="crp_burst", subject_type="receipt", subject_id=receipt_id,
                             receipt_id=receipt_id, payload=WithdrawalAccepted(
                                 receipt_id=receipt_id, source=Source(corpus_id="crp_burst", namespace="n",
                                                                      record_key=uuid.uuid4().hex),
                                 accepted_at="2024-01-01T00:00:00Z"))
            async with journal_transaction(conn):
                await append(conn, [event])
            await asyncio.sleep(every_seconds)


class RestingTally(Tally):
    """A Tally that rests in bursts of ingests, as the folds on the way to searchable do."""

    rests_in_ingest_bursts = True


class SlowTally(RestingTally):
    """A resting Tally whose every step takes at least 10 ms, as a real fold's do."""

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        await super().apply(conn, events)
        await conn.execute("SELECT pg_sleep(0.01)")


def fold_during_withdrawals(url: str, backlog: int, withdrawals: int, burst_seconds: float,
                            fold: Callable[[], Tally] = RestingTally) -> tuple[list, tuple]:
    """A Tally fold (made by `fold`) started on `backlog` events while `withdrawals` more arrive
    every 20 ms; returns the `projector_rested` lines it logged and (rows, distinct positions,
    checkpoint, head) once it caught up."""
    async def scenario():
        await append_events(url, backlog)
        stop = asyncio.Event()
        task = asyncio.create_task(run(url, fold(), stop=stop, poll_seconds=0.2, ingest_burst_seconds=burst_seconds))
        try:
            await append_withdrawals(url, withdrawals, every_seconds=0.02)
            async with await AsyncConnection.connect(url, autocommit=True) as conn:
                target = await head(conn)
            for _ in range(600):  # 60 s at most
                if (await tally_counts(url))[2] >= target:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)  # the step after the last one: it finds nothing and ends the rest
            return (*await tally_counts(url), target)  # read once the fold is still (two statements)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)

    with capture_logs() as logs:
        counts = asyncio.run(scenario())
    return [e for e in logs if e["event"] == "projector_rested"], counts


@pytest.fixture(autouse=True)
def every_rest_logged(monkeypatch):
    # The service logs a burst's rests from a second on (fewer lines under a steady load); these
    # short scenarios rest less, and their log lines are what the tests read.
    monkeypatch.setattr(IngestBurst, "LOGGED_REST_SECONDS", 0.0)


@pytest.fixture
def url(databases) -> str:
    return tally_database(databases)


def test_a_fold_behind_a_burst_rests_folds_everything_once_and_catches_up(url):
    lines, (rows, distinct, checkpoint, target) = fold_during_withdrawals(url, backlog=400, withdrawals=60,
                                                                         burst_seconds=60)
    assert rows == distinct == target and checkpoint == target  # every event once, none lost to a rest
    assert len(lines) == 1 and lines[0]["projector"] == "tally"
    assert lines[0]["reason"] == "caught_up" and lines[0]["rested_seconds"] > 0


def test_past_its_burst_time_a_fold_folds_on_without_resting(url):
    # 0.3 s of rest at most: the backlog of 2,000 events (80 steps of 25, 10 ms each) outlasts it.
    lines, (rows, distinct, checkpoint, target) = fold_during_withdrawals(url, backlog=2000, withdrawals=100,
                                                                         burst_seconds=0.3, fold=SlowTally)
    assert rows == distinct == target and checkpoint == target
    assert [e["reason"] for e in lines] == ["burst_time_spent"]


def test_a_fold_with_no_burst_time_never_rests(url):
    lines, (rows, distinct, checkpoint, target) = fold_during_withdrawals(url, backlog=400, withdrawals=30,
                                                                         burst_seconds=0)
    assert rows == distinct == target and checkpoint == target
    assert lines == []


class ShortSteppingTally(RestingTally):
    """A resting Tally that reads 5 positions per step while ingests keep arriving, 25 otherwise;
    it notes each step's size and whether ingests were arriving."""

    contended_batch_size = 5

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[int, bool]] = []

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        await super().apply(conn, events)
        self.steps.append((len(events), self.ingests_arriving))


def test_while_ingests_arrive_a_fold_with_a_contended_step_size_takes_short_steps(url):
    # decisions.md "Folds rest in bursts of ingests": the materializer's append holds the journal
    # lock for as long as its step is large, and every append of the API waits meanwhile.
    tally = ShortSteppingTally()
    lines, (rows, distinct, checkpoint, target) = fold_during_withdrawals(url, backlog=400, withdrawals=60,
                                                                         burst_seconds=60, fold=lambda: tally)
    assert rows == distinct == target and checkpoint == target
    contended = [size for size, arriving in tally.steps if arriving]
    assert contended and max(contended) <= 5
    assert tally.steps[0] == (25, False)  # the backlog's first step, before any ingest was heard
    assert lines[0]["reason"] == "caught_up"
