"""The projector contract (projectors/base.py, projectors/runner.py) on a real PostgreSQL.

- A fold's output and its checkpoint commit together: an exception inside
  the fold leaves both as they were.
- A fold that reads a few kinds is given those alone, in order, and its
  checkpoint still moves past the positions that hold none of them.
- A fold whose database goes away (its backends terminated mid-transaction,
  or the database refusing connections for a while) waits the outage out
  and resumes: every event is folded exactly once, and each outage is one
  `database_unavailable` line (and one `database_available`), not a
  traceback per retry.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import psycopg
import pytest
from psycopg import AsyncConnection
from structlog.testing import capture_logs

from contentsvc.journal import checkpoints
from contentsvc.journal.events import UPLOAD_FAILED, JournalEvent, NewEvent, UploadFailed, UploadReceived
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.projectors.base import ExternalFold, TableFold
from contentsvc.projectors.runner import run


def failed_upload(upload_id: str) -> UploadFailed:
    return UploadFailed(upload_id=upload_id, error={"code": "upload_expired"}, failed_at="2024-01-01T00:00:00Z")


def received_upload(upload_id: str) -> UploadReceived:
    return UploadReceived(upload_id=upload_id, size_bytes=1, sha256="0" * 64, received_at="2024-01-01T00:00:00Z")


async def append_events(url: str, n: int, payload=failed_upload) -> None:
    """n internal events (uploads that failed, by default: no projector of the service acts on them)."""
    events = [NewEvent(org_id="contract", subject_type="upload", subject_id=f"upl_{i}", payload=payload(f"upl_{i}"))
              for i in (uuid.uuid4().hex for _ in range(n))]
    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        async with journal_transaction(conn):
            await append(conn, events)


async def head(conn: AsyncConnection) -> int:
    return (await (await conn.execute("SELECT coalesce(max(position), 0) FROM journal")).fetchone())[0]


class Tally(TableFold):
    """Writes each event's position into `tally` (no unique key: a second fold of an event shows)."""

    name = "tally"
    batch_size = 25

    def __init__(self) -> None:
        self.fail_on_call: int | None = None
        self.calls = 0
        self.hold_next = False  # the next fold stops inside its transaction until released
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        self.calls += 1
        await conn.execute("INSERT INTO tally (position) SELECT unnest(%s::bigint[])", ([e.position for e in events],))
        if self.calls == self.fail_on_call:
            raise ValueError("the fold failed")
        if self.hold_next:
            self.hold_next = False
            self.inside.set()
            await self.release.wait()
            self.release.clear()


async def tally_counts(url: str) -> tuple[int, int, int]:
    """(rows, distinct positions, checkpoint)."""
    async with await AsyncConnection.connect(url, autocommit=True) as conn:
        rows, distinct = await (await conn.execute("SELECT count(*), count(DISTINCT position) FROM tally")).fetchone()
        cur = await conn.execute("SELECT position FROM projector_checkpoints WHERE name = 'tally'")
        row = await cur.fetchone()
        return rows, distinct, row[0] if row else 0


def tally_database(databases) -> str:
    """A fresh database with the `tally` table Tally folds into."""
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE tally (position bigint NOT NULL)")
    return url


@pytest.fixture
def url(databases) -> str:
    return tally_database(databases)


def test_an_exception_in_the_fold_leaves_output_and_checkpoint_unchanged(url):
    async def scenario():
        await append_events(url, 60)
        projector = Tally()
        projector.fail_on_call = 2
        async with await AsyncConnection.connect(url) as conn:
            await projector.open(conn)
            assert await projector.step(conn)  # the first batch commits
            assert await tally_counts(url) == (25, 25, (await head(conn)) - 35)
            with pytest.raises(ValueError):
                await projector.step(conn)  # the second writes its rows, then fails
            assert await tally_counts(url) == (25, 25, (await head(conn)) - 35)
            while await projector.step(conn):
                pass
            assert await tally_counts(url) == (60, 60, await head(conn))

    asyncio.run(scenario())


class Indexed(ExternalFold):
    """An ExternalFold whose outside work is a list in memory."""

    name = "indexed"

    def __init__(self) -> None:
        super().__init__()
        self.outside: list[int] = []
        self.fail_inside = False
        self.skip_checkpoint = False

    async def fold(self, conn: AsyncConnection, events: list[JournalEvent], through: int) -> None:
        self.outside += [e.position for e in events]
        if self.skip_checkpoint:
            return
        async with self.checkpointed(conn, through):
            await conn.execute("INSERT INTO tally (position) SELECT unnest(%s::bigint[])",
                               ([e.position for e in events],))
            if self.fail_inside:
                raise ValueError("publishing failed")


def test_an_external_fold_commits_its_checkpoint_with_what_it_publishes(url):
    async def scenario():
        await append_events(url, 10)
        projector = Indexed()
        async with await AsyncConnection.connect(url) as conn:
            await projector.open(conn)
            projector.fail_inside = True
            with pytest.raises(ValueError):
                await projector.step(conn)
            assert projector.position == 0
            assert await checkpoints.position(conn, "indexed") == 0
            await conn.rollback()
            projector.fail_inside, projector.skip_checkpoint = False, True
            with pytest.raises(RuntimeError, match="without committing its checkpoint"):
                await projector.step(conn)
            projector.skip_checkpoint = False
            assert not await projector.step(conn)
            assert projector.position == await head(conn) == await checkpoints.position(conn, "indexed")
            rows = (await (await conn.execute("SELECT count(*) FROM tally")).fetchone())[0]
            assert rows == 10 and len(projector.outside) == 30  # the outside work repeats; the commit does not

    asyncio.run(scenario())


def test_a_lost_database_is_waited_out_and_every_event_is_folded_once(url, admin_url, caplog):
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]

    async def terminate_projector() -> None:
        async with await AsyncConnection.connect(admin_url, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                " WHERE datname = %s AND application_name = 'contentsvc projector tally'", (dbname,))

    async def allow_connections(allowed: bool) -> None:
        async with await AsyncConnection.connect(admin_url, autocommit=True) as admin:
            await admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS {str(allowed).lower()}')

    async def caught_up() -> None:
        async with await AsyncConnection.connect(url, autocommit=True) as conn:
            target = await head(conn)
        for _ in range(600):
            if (await tally_counts(url))[2] >= target:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the projector did not catch up")

    async def killed_inside_a_fold(projector: Tally, refuse_for: float = 0.0) -> None:
        """The next fold is stopped inside its transaction, its backends are terminated
        (and, for refuse_for seconds, new connections refused), then it goes on."""
        projector.inside.clear()
        projector.hold_next = True
        await append_events(url, 40)
        await asyncio.wait_for(projector.inside.wait(), timeout=60)
        if refuse_for:
            await allow_connections(False)
        await terminate_projector()
        projector.release.set()
        if refuse_for:
            await asyncio.sleep(refuse_for)  # several retries fail meanwhile
            await allow_connections(True)

    async def scenario() -> None:
        projector = Tally()
        stop = asyncio.Event()
        await append_events(url, 100)
        task = asyncio.create_task(run(url, projector, poll_seconds=0.2, retry_first_seconds=0.05,
                                       retry_cap_seconds=0.2, stop=stop))
        try:
            await killed_inside_a_fold(projector)
            await caught_up()
            await killed_inside_a_fold(projector, refuse_for=1.0)
            await caught_up()
            await terminate_projector()  # while it waits for a commit
            await append_events(url, 100)
            await caught_up()
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)

    caplog.set_level(logging.WARNING)
    try:
        with capture_logs() as logs:
            asyncio.run(scenario())
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')

    rows, distinct, checkpoint = asyncio.run(tally_counts(url))
    with psycopg.connect(url) as conn:
        assert checkpoint == conn.execute("SELECT max(position) FROM journal").fetchone()[0]
    assert rows == distinct == 280  # every event folded, none twice
    events = [entry["event"] for entry in logs]
    assert events.count("database_unavailable") == 3, events
    assert events.count("database_available") == 3, events
    lost = [entry for entry in logs if entry["event"] == "database_unavailable"]
    assert all(entry["log_level"] == "warning" and entry["error"] and entry["process"] == "projector:tally"
               for entry in lost)
    assert not any("exc_info" in entry or "exception" in entry for entry in logs)
    # psycopg itself may note, once, that the pipeline of the transaction it lost could not end.
    library = [r for r in caplog.records if r.getMessage().endswith("the connection is lost")]
    assert library == caplog.records and len(library) <= 3 and not any(r.exc_info for r in library)


class LeavesTransactionOpen(TableFold):
    """A defective fold: its first step reads and returns inside the transaction it began."""

    name = "leaky"

    def __init__(self) -> None:
        self.steps = 0

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        await conn.execute("INSERT INTO tally (position) SELECT unnest(%s::bigint[])", ([e.position for e in events],))

    async def step(self, conn: AsyncConnection) -> bool:
        self.steps += 1
        if self.steps == 1:
            await conn.execute("SELECT 1")  # a transaction begun and never ended
            return False
        return await super().step(conn)


def test_a_step_that_leaves_a_transaction_open_is_rolled_back_and_the_next_commit_wakes_the_fold(url):
    # Projector.step: every step ends its transactions, or PostgreSQL holds back the notifications
    # its wait listens for until the next poll; the runner rolls such a transaction back and logs it.
    async def scenario() -> tuple[int, int]:
        projector = LeavesTransactionOpen()
        stop = asyncio.Event()
        task = asyncio.create_task(run(url, projector, poll_seconds=4.0, stop=stop))
        try:
            for _ in range(200):
                if projector.steps >= 1:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # the runner now waits for a commit (a 4 s poll: only a wake-up ends it sooner)
            await append_events(url, 5)
            async with await AsyncConnection.connect(url, autocommit=True) as conn:
                target = await head(conn)
            for _ in range(40):  # 2 s at most: well inside the poll
                rows = (await tally_counts(url))[0]
                if rows >= 5:
                    break
                await asyncio.sleep(0.05)
            return rows, target
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=30)

    with capture_logs() as logs:
        rows, _ = asyncio.run(scenario())
    assert rows == 5  # folded on the wake-up, not after the poll
    assert [e for e in logs if e["event"] == "projector_step_left_transaction_open"][0]["projector"] == "leaky"


class FailedUploadsTally(Tally):
    reads = frozenset({UPLOAD_FAILED})


class FailedUploadsIndexed(Indexed):
    name = "indexed"
    batch_size = 25
    reads = frozenset({UPLOAD_FAILED})


@pytest.mark.parametrize("fold", [FailedUploadsTally, FailedUploadsIndexed])
def test_a_fold_reading_a_few_kinds_gets_those_alone_and_moves_past_the_others(url, fold):
    async def scenario():
        await append_events(url, 10)
        await append_events(url, 60, received_upload)  # more than two batches' positions holding none it reads
        await append_events(url, 30)
        await append_events(url, 3, received_upload)
        projector = fold()
        async with await AsyncConnection.connect(url) as conn:
            await projector.open(conn)
            steps = 1
            while await projector.step(conn):
                steps += 1
                assert steps < 10
            cur = await conn.execute("SELECT position FROM journal WHERE kind = %s ORDER BY position", (UPLOAD_FAILED,))
            failed = [r[0] for r in await cur.fetchall()]
            folded = (await (await conn.execute("SELECT array_agg(position ORDER BY position) FROM tally")).fetchone())[0]
            checkpoint = await checkpoints.position(conn, projector.name)
            return failed, folded, checkpoint, await head(conn), steps

    failed, folded, checkpoint, last, steps = asyncio.run(scenario())
    assert folded == failed and len(failed) == 40
    assert checkpoint == last  # the trailing events it does not read are passed too
    # Positions 1-10 in the first 25; 26-70 crossed in one step, up to the next event it reads;
    # 71-95, then 96-100 with the trailing three.
    assert steps == 4
