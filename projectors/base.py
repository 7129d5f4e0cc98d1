"""The projector contract: what a fold is, and how a batch meets its checkpoint.

A projector reads the journal after its checkpoint, in batches, and stores
the new checkpoint atomically with what it made of the batch. Where that
output lives decides the base a projector extends:

- `TableFold`: the output is Postgres rows (read tables, events appended to
  the journal). `apply` runs inside the transaction that moves the
  checkpoint, so a kill -9 at any instant keeps all of a batch or none of it.
- `ExternalFold`: part of the work happens outside the database (an index
  commit, an embedding, a call to another service). `fold` receives the
  batch, does that work outside any transaction, then writes what it learned
  inside `checkpointed(...)`, the transaction that moves the checkpoint. A
  crash between the outside work and that commit repeats the work for the
  same events, so it must be idempotent (delete then add, insert if absent).
- `PeriodicWorker`: no fold at all; a task run at start and then every
  interval (collecting garbage), under the same single-instance lock and
  outage handling.
- `GenerationFold`: an ExternalFold whose output is the serving index
  generation (search/generations.py): the checkpoint is the generation's,
  committed after the index, and a replay's cutover makes it reopen on the
  generation that serves next.

The process around a fold (the single-instance lock, waking on commits,
surviving a lost database) is `projectors/runner.py`, the same for all.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import AsyncIterator, ClassVar

import psycopg
from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.journal import checkpoints
from contentsvc.journal.events import JournalEvent
from contentsvc.journal.store import first_position
from contentsvc.journal.store import head as journal_head
from contentsvc.journal.store import read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.search import generations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`1 run`, `3 runs`: for the words of `Projector.waiting`."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def oldest_due(delay: timedelta | None) -> str:
    """`, the oldest due N s ago` for the oldest item past its time; empty when none is."""
    return "" if delay is None else f", the oldest due {max(0, round(delay.total_seconds())):,} s ago"


class Projector(ABC):
    """A fold over the journal, run by `runner.run` as its own process."""

    name: ClassVar[str]
    batch_size: ClassVar[int] = 1000
    # Positions per step while ingests keep arriving (None: batch_size), for a fold whose append
    # is large: every append waits while one holds the journal lock, so in a burst its steps are
    # short and the API's appends pass between them; once ingests stop it folds in full steps
    # again, each with its fixed cost (a durable commit).
    contended_batch_size: ClassVar[int | None] = None
    # Set by the runner after each step: whether ingests (or withdrawals) arrived since the one
    # before (runner.IngestBurst; only for a fold that rests in bursts).
    ingests_arriving: bool = False
    # One process of this kind at a time (a session advisory lock), unless the work is shared out
    # by row leases (the deliveries worker), when any number may run side by side.
    single_instance: ClassVar[bool] = True
    # The event families (`connector` for connector.run.changed) whose appends wake it; None:
    # every append. A worker that acts on a few families, and polls for the rest of its work,
    # listens to their channels alone (schema/025) and is not woken by each ingest.
    wakes_on: ClassVar[tuple[str, ...] | None] = None
    # Whether its commits are announced on PROGRESS_CHANNEL: the API listens for the read model's
    # (change streams), and for no other fold's (its lexical searcher checks the index files). A
    # NOTIFY holds PostgreSQL's notify-queue lock through its transaction's commit, so every
    # announcing commit waits for the others: folds nobody listens to stay silent.
    announces_progress: ClassVar[bool] = False
    # Its process's niceness at start is `[processes] background_niceness` (10) plus this. Every
    # fold and worker is work done after a 202, so when the cores are short the API answers first
    # (accepting, searching) and the folds catch up after the burst; on an idle machine niceness
    # changes nothing. Work off the path to searchable (embedding) yields further.
    niceness_above_background: ClassVar[int] = 0
    # How long commits gather after a wake-up before the next step when they arrive quickly
    # (runner.Pace; None: the runner's 50 ms). Longer for a fold whose every step has a high
    # fixed cost, such as an index commit.
    coalesce_seconds: ClassVar[float | None] = None
    # Whether it rests between steps while it is behind in a burst of ingests (runner.IngestBurst):
    # the folds on the way to searchable and embedding declare it; a worker whose latency is the
    # point (the monitor's webhooks) or whose work is waiting on others (deliveries, connectors,
    # plugins) does not.
    rests_in_ingest_bursts: ClassVar[bool] = False
    # Whether its lag is by design (no 429 counts it, an event says when it caught up): it then
    # rests through a whole burst, not only its first `[processes] ingest_burst_seconds`.
    lags_by_design: ClassVar[bool] = False
    # Work of its own that outlives a step and uses the step's connection in transactions of its
    # own (the connectors worker's runs): the runner then leaves an open transaction alone.
    runs_beside_steps: ClassVar[bool] = False
    # The kinds a fold folds; None: every kind. A fold that needs a few is given only those: the
    # payloads of the others (an ingest's text, a Version's manifest) are neither sent nor decoded
    # (most of the monitor's time went to decoding events it skipped).
    reads: ClassVar[frozenset[str] | None] = None
    # The events of the batch a step is folding, until they are committed: a step that fails
    # is recorded at them (projectors/faults.py). And the position its checkpoint reached after
    # a step. The runner resets both before each step.
    folding: tuple[JournalEvent, ...] = ()
    folded_through: int = 0
    # Set by the runner after a step failed on events, to the first of them, until a step gets
    # past them (`batch_bounds`): the fault then names the one event the fold stops at.
    isolating_from: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "Projector":
        """How the process registry builds one."""
        return cls()

    @staticmethod
    def waiting(conn: psycopg.Connection) -> str | None:
        """The work waiting for it in tables of its own, in words, for `contentsvc worker status`
        (on the operator's synchronous connection); None for a fold whose work is the journal
        (its lag says it) or a worker on a timer."""
        return None

    @property
    def step_size(self) -> int:
        """Positions the next step reads: fewer while ingests keep arriving (contended_batch_size)."""
        if self.ingests_arriving and self.contended_batch_size:
            return self.contended_batch_size
        return self.batch_size

    def batch_bounds(self, position: int) -> tuple[int, int | None]:
        """The size of the batch after `position` and the last position it may reach. While a
        fault's events are isolated, the events before them are read in full batches ending just
        before them (not decoding them, nor failing with them), then those events one at a time:
        a fold that reopens further back (a lost index refolded from 0) goes at full speed until
        it reaches them."""
        first = self.isolating_from
        if first is None:
            return self.step_size, None
        if position + 1 >= first:
            return 1, None
        return self.step_size, first - 1

    async def open(self, conn: AsyncConnection) -> None:
        """Load what the fold keeps between batches. Called with the single-instance lock held,
        at start and again after a reconnection: memory may then be ahead of what committed."""

    @abstractmethod
    async def step(self, conn: AsyncConnection) -> bool:
        """Fold the next batch (the connection is outside any transaction); True when more
        work is waiting, so the runner comes back at once instead of waiting for a commit."""

    async def announce_progress(self, conn: AsyncConnection) -> None:
        """Inside the transaction that moves its checkpoint: tell the API, when it listens."""
        if self.announces_progress:
            await checkpoints.announce(conn, self.name)

    def idle_poll_seconds(self) -> float | None:
        """How soon the runner should step again without a commit, when sooner than its poll:
        for work of its own that ends without a journal commit. None: the runner's poll."""
        return None


# How far one step of a fold reading a few kinds looks past a batch holding none of them, in
# batches: a stretch of other folds' events (a backlog's availability changes) is crossed in one
# step, a durable commit of the checkpoint, rather than in one per batch_size positions.
SPARSE_SCAN = 16


async def next_batch(conn: AsyncConnection, position: int, size: int, kinds: frozenset[str] | None,
                     at_most: int | None = None) -> tuple[list[JournalEvent], int, bool]:
    """The next batch after `position`, reaching `at_most` at the furthest: its events (of
    `kinds` alone, when given), the position it reaches, and whether the journal holds more. A
    fold that reads a few kinds moves `size` positions at a time, and past a stretch holding none
    of them up to the next one it reads."""
    if kinds is None and at_most is None:
        events = await read_after(conn, position, size)
        return events, events[-1].position if events else position, len(events) == size
    # The head is read first: an event appended after it has a higher position (journal/store.py).
    head = await journal_head(conn)
    last = head if at_most is None else min(head, at_most)
    if kinds is None:
        events = await read_after(conn, position, size, None, last)
        if len(events) == size:
            return events, events[-1].position, True
        return events, last, last < head  # every event up to `last` was read
    through = min(last, position + size)
    if through == position:
        return [], position, False
    wanted = sorted(kinds)
    events = await read_after(conn, position, size, wanted, through)
    if not events and through < last:
        reach = min(last, position + SPARSE_SCAN * size)
        following = await first_position(conn, through, wanted, reach)
        through = reach if following is None else following - 1
    return events, through, through < head


class PeriodicWorker(Projector):
    """A worker that reads no journal: `run_once` at start, then every `interval_seconds`.
    Between runs `step` answers False, so the runner waits for its poll and looks again; a
    lost database is waited out and the run repeated, as for a fold."""

    wakes_on = ()

    def __init__(self, interval_seconds: float) -> None:
        self.interval_seconds = interval_seconds
        self._due = 0.0  # monotonic time of the next run: at once

    @abstractmethod
    async def run_once(self, conn: AsyncConnection) -> None:
        """One pass of the task (the connection is outside any transaction)."""

    async def step(self, conn: AsyncConnection) -> bool:
        if time.monotonic() >= self._due:
            await self.run_once(conn)
            self._due = time.monotonic() + self.interval_seconds
        return False


class TableFold(Projector):
    """A fold whose output is Postgres rows, written in the checkpoint's transaction."""

    @abstractmethod
    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        """Fold a batch inside the open transaction; idempotent per event (a replay re-applies)."""

    async def open(self, conn: AsyncConnection) -> None:
        async with conn.transaction():
            await checkpoints.ensure(conn, self.name)

    async def step(self, conn: AsyncConnection) -> bool:
        # Looking costs no write: the checkpoint row is locked (which writes WAL and needs a
        # durable commit) only when there is something to fold. The lock keeps an operator's
        # replay and this fold from interleaving.
        async with journal_transaction(conn):
            position = await checkpoints.position(conn, self.name)
            size, at_most = self.batch_bounds(position)
            events, through, more = await next_batch(conn, position, size, self.reads, at_most)
            if through == position:
                self.folded_through = position
                return False
            if await checkpoints.position(conn, self.name, for_update=True) != position:
                return True  # a replay committed meanwhile: read again from its checkpoint
            # The checkpoint and the notification are written before the fold's own writes: an
            # append among those takes the journal lock, and every statement after it until COMMIT
            # is sent at this (niced) process's pace while every other append waits.
            await checkpoints.advance(conn, self.name, through)
            await self.announce_progress(conn)
            if events:
                self.folding = tuple(events)
                await self.apply(conn, events)
        self.folding, self.folded_through = (), through
        return more


class ExternalFold(Projector):
    """A fold that works outside the database and then commits its checkpoint itself."""

    def __init__(self) -> None:
        self.position = 0  # what the output reflects: the next batch is read after it
        # Whether the journal held more than the batch `fold` is given when it was read: a fold
        # whose outside work has a high fixed cost may read further batches before doing it.
        self.journal_has_more = False

    @property
    def checkpoint_name(self) -> str:
        return self.name

    async def open(self, conn: AsyncConnection) -> None:
        async with conn.transaction():
            await checkpoints.ensure(conn, self.checkpoint_name)
            self.position = await checkpoints.position(conn, self.checkpoint_name)

    @abstractmethod
    async def fold(self, conn: AsyncConnection, events: list[JournalEvent], through: int) -> None:
        """Do the batch's outside work, then write what it learned inside
        `async with self.checkpointed(conn, through)` (the batch's last position, which the
        events, of the kinds it reads, may not reach). A fold whose work per event is long may
        end the step sooner, checkpointing where it stopped (past one event at least): the
        step then reports more, and the next one reads on from there."""

    async def after_batch(self, conn: AsyncConnection, idle: bool) -> bool:
        """Work between batches (a backfill chunk, a purge, a snapshot); `idle` when the
        journal had nothing new. True while more of it waits."""
        return False

    def publishing(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """The transaction a fold writes in (it may append to the journal)."""
        return journal_transaction(conn)

    @asynccontextmanager
    async def checkpointed(self, conn: AsyncConnection, through: int) -> AsyncIterator[None]:
        """The transaction that writes what the fold learned and moves the checkpoint to `through`."""
        async with self.publishing(conn):
            # First, as in TableFold.step: the body's append is then its last statement before COMMIT.
            await checkpoints.advance(conn, self.checkpoint_name, through)
            await self.announce_progress(conn)
            yield
        self.position = through

    async def step(self, conn: AsyncConnection) -> bool:
        async with conn.transaction():
            size, at_most = self.batch_bounds(self.position)
            events, through, more = await next_batch(conn, self.position, size, self.reads, at_most)
        moved = through > self.position
        self.journal_has_more = more
        if events:
            self.folding = tuple(events)  # a fold that gathers further batches adds theirs
            await self.fold(conn, events, through)
            if self.position < events[0].position:
                raise RuntimeError(f"{self.name}: the fold returned without committing its checkpoint")
            if self.position < through:  # it ended the step sooner
                self.journal_has_more = True
            self.folding = ()
        elif moved:
            async with self.checkpointed(conn, through):
                pass  # positions holding no kind it reads: only the checkpoint moves
        self.folded_through = self.position
        return await self.after_batch(conn, idle=not moved) or self.journal_has_more


class GenerationRetired(Exception):
    """The generation stopped serving (a replay cut over): what was about to be published is
    dropped, and the fold reopens on the generation that serves now."""


class GenerationFold(ExternalFold):
    """An ExternalFold into the serving generation of the index kind `name`."""

    def __init__(self, home: Path) -> None:
        super().__init__()
        self.home = home  # generations live under home/indexes/KIND/GEN
        self.generation: generations.Generation | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "GenerationFold":
        return cls(settings.home)

    @property
    def checkpoint_name(self) -> str:
        return self.generation.checkpoint_name

    async def open(self, conn: AsyncConnection) -> None:
        self.generation = None  # the serving generation is opened (again) by the next step

    @abstractmethod
    async def open_generation(self, conn: AsyncConnection, generation: generations.Generation,
                              published: int) -> int:
        """Load the generation's output; returns the position it reflects. `published` is the
        generation's checkpoint: the index may be behind it (files lost or restored), never ahead."""

    def publishing(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        return self.holding_generation(conn)

    @asynccontextmanager
    async def holding_generation(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """A journal transaction holding the generation's row: a replay's cutover waits for it,
        and once the generation retired nothing is written (GenerationRetired). The row is
        taken before the journal lock, as a cutover takes them, so the two cannot deadlock."""
        async with journal_transaction(conn):
            if not await generations.hold_if_serving(conn, self.generation):
                raise GenerationRetired(self.generation.generation_id)
            yield

    async def step(self, conn: AsyncConnection) -> bool:
        serving = await generations.serving_or_first(conn, self.name)
        if self.generation is None or serving.generation_id != self.generation.generation_id:
            async with conn.transaction():
                published = await checkpoints.position(conn, serving.checkpoint_name)
            self.generation = serving
            self.position = await self.open_generation(conn, serving, published)
        try:
            return await super().step(conn)
        except GenerationRetired:
            self.generation = None
            return False
