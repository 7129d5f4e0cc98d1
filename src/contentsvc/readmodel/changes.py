"""The change feed: the journal read through an authorization filter.

A change cursor binds the Organization, the corpus_id filter and the key's
scope digest, and carries the journal position it stands at plus the time
it was issued (for retention). Public events are invalidations with ids
only. `next_cursor` advances over scanned events even when none is visible:
when a page is not full it moves to the feed head read in the same
snapshot, which is safe because positions are assigned in commit order.
"""

from __future__ import annotations

import asyncio
import time

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import Principal
from contentsvc.domain.clock import iso
from contentsvc.domain.cursors import CursorCodec, InvalidCursor, resync_url
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import ChangeEvent, ChangeSubject
from contentsvc.journal.store import head as journal_head

CHANGE_CURSOR = "changes"


class FeedTicker:
    """Counts feed-head moves announced over LISTEN.

    A stream reads the count before it scans and waits only while the count
    is unchanged, so a move announced during the scan is never missed.
    """

    def __init__(self) -> None:
        self.count = 0
        self._moved = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def wait_past(self, seen: int, timeout: float) -> None:
        if self.count != seen:
            return
        try:
            await asyncio.wait_for(self._moved.wait(), timeout)
        except asyncio.TimeoutError:
            pass


class ChangeCursors:
    def __init__(self, codec: CursorCodec, retention_seconds: int) -> None:
        self.codec = codec
        self.retention_seconds = retention_seconds

    @staticmethod
    def _binding(p: Principal, corpus_id: str) -> dict:
        return {"org": p.org_id, "corpus": corpus_id, "scope": p.scope_digest()}

    def encode(self, p: Principal, corpus_id: str, position: int) -> str:
        return self.codec.encode(CHANGE_CURSOR, pos=position, t=int(time.time()), **self._binding(p, corpus_id))

    def decode(self, p: Principal, corpus_id: str, token: str, field: str = "/cursor") -> int:
        """The position a cursor stands at; 422, 409 or 410 as the contract says."""
        try:
            fields = self.codec.decode(token, CHANGE_CURSOR)
        except InvalidCursor:
            raise ApiError(422, "invalid_cursor", "The cursor is not a change cursor.", field=field) from None
        if any(fields.get(k) != v for k, v in self._binding(p, corpus_id).items()):
            raise ApiError(409, "cursor_scope_changed", "The cursor was issued for another filter or scope.",
                           resync_url=resync_url(corpus_id))
        if time.time() - fields["t"] > self.retention_seconds:
            raise ApiError(410, "cursor_expired", "The cursor is older than the change retention; resynchronize.",
                           resync_url=resync_url(corpus_id))
        return fields["pos"]


def _change_event(row: tuple) -> ChangeEvent:
    _, event_id, kind, corpus_id, subject_type, subject_id, version_id, receipt_id, committed_at = row
    return ChangeEvent(
        event_id=event_id,
        kind=kind,
        corpus_id=corpus_id,
        subject=ChangeSubject(type=subject_type, id=subject_id),
        committed_at=iso(committed_at),
        version_id=version_id,
        receipt_id=receipt_id,
    )


FEED_PROJECTOR = "readmodel"

# decisions-part2 "Change-feed event kinds added": the kinds of these families are visible only to a
# key holding this action besides changes:read.
FAMILY_ACTIONS = {
    "saved_query": "monitoring:read",
    "subscription": "monitoring:read",
    "match": "monitoring:read",
    "delivery": "monitoring:read",
    "connector": "connectors:read",
}


def hidden_families(p: Principal) -> list[str]:
    """The kind families (the part of a kind before its first dot) this key may not see."""
    return sorted(family for family, action in FAMILY_ACTIONS.items() if not p.may(action))


async def head_position(conn: AsyncConnection) -> int:
    """The feed's head: the position through which the read tables reflect the journal.

    An event is published only once the read model has folded it, so a
    client that rereads on an invalidation never reads the state before it;
    and a start-now cursor never skips events the catalog does not show yet.
    """
    cur = await conn.execute("SELECT position FROM projector_checkpoints WHERE name = %s", (FEED_PROJECTOR,))
    row = await cur.fetchone()
    return row[0] if row else 0


async def start_position(pool: AsyncConnectionPool, feed_moved: FeedTicker, wait_seconds: float = 2.0) -> int:
    """The start-now position: the journal's committed head, once the read model has reached it.

    Waiting (briefly) for the read model makes "start now" mean now: the
    cursor does not deliver again what the caller just did. If the read model
    lags longer, the feed head is returned: a few duplicates, never a miss.
    A pooled connection is held only for each look, not while waiting.
    """
    async with pool.connection() as conn:
        target = await journal_head(conn)
    deadline = time.monotonic() + wait_seconds
    while True:
        seen = feed_moved.count
        async with pool.connection() as conn:
            position = await head_position(conn)
        remaining = deadline - time.monotonic()
        if position >= target or remaining <= 0:
            return min(position, target)
        await feed_moved.wait_past(seen, timeout=min(remaining, 0.2))


async def read_page(
    conn: AsyncConnection, org_id: str, corpus_id: str, after: int, limit: int, hidden: list[str] = ()
) -> tuple[list[tuple[int, ChangeEvent]], int]:
    """Visible events after a position, and the position the next read starts from; `hidden`:
    kind families the key may not see (hidden_families)."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        head = await head_position(conn)
        cur = await conn.execute(
            "SELECT position, event_id, kind, corpus_id, subject_type, subject_id, version_id, receipt_id,"
            "       committed_at FROM journal"
            " WHERE org_id = %s AND corpus_id = %s AND public AND position > %s AND position <= %s"
            "   AND split_part(kind, '.', 1) <> ALL(%s::text[])"
            " ORDER BY position LIMIT %s",
            (org_id, corpus_id, after, head, list(hidden), limit),
        )
        rows = await cur.fetchall()
    events = [(row[0], _change_event(row)) for row in rows]
    next_position = events[-1][0] if len(events) == limit else max(head, after)
    return events, next_position


Page = tuple[list[tuple[int, ChangeEvent]], int]


class StreamPages:
    """The change streams' page reads, shared and bounded.

    Every commit the read model announces wakes every stream at once, and the
    streams of one Corpus that have caught up stand at the same position:
    they ask for the same page. It is read once, and every stream asking for
    it while that read runs takes its answer. At most `at_once` reads run
    together, so however many streams are open they hold no more than that
    many of the API's pooled connections: the writes keep the rest. (With a
    connection per stream and wake, two dozen streams woken by every batch
    filled the pool, and ingests waited out `pool_wait_seconds`.)
    """

    def __init__(self, pool: AsyncConnectionPool, at_once: int = 4, page_size: int = 200) -> None:
        self.pool = pool
        self.page_size = page_size
        self._slots = asyncio.Semaphore(at_once)
        self._reading: dict[tuple, asyncio.Task[Page]] = {}

    async def read(self, org_id: str, corpus_id: str, after: int, hidden: list[str], announced: int) -> Page:
        """`announced`: the FeedTicker's count the stream read before asking. A read is shared only
        among streams that read the same count: one started earlier might not show a commit the
        stream was woken for, and the stream would wait for the next one to see it."""
        key = (org_id, corpus_id, after, tuple(hidden), announced)
        task = self._reading.get(key)
        if task is None:
            # A task of its own: a stream that hangs up mid-read does not cancel the others' page.
            task = asyncio.create_task(self._read(org_id, corpus_id, after, hidden))
            self._reading[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    async def _read(self, org_id: str, corpus_id: str, after: int, hidden: list[str]) -> Page:
        async with self._slots, self.pool.connection() as conn:
            return await read_page(conn, org_id, corpus_id, after, self.page_size, hidden)

    def _done(self, key: tuple, task: asyncio.Task[Page]) -> None:
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every stream that asked may have hung up
