"""The change streams' page reads (part 1 rule 19) against a real database: streams of one Corpus
woken by one commit share one read, a stream that hangs up does not take the others' page with
it, and however many streams read at once they hold a bounded number of the pool's connections,
so writes keep the rest (docs/decisions.md "Change feed")."""

from __future__ import annotations

import asyncio
import time

from psycopg import AsyncConnection

from contentsvc.readmodel.changes import FEED_PROJECTOR, StreamPages
from contentsvc.storage.database import async_pool
from tests.conftest import LOCK_WAITERS

ORG, CORPUS = "org_streams", "cor_streams"


async def with_public_events(url: str, count: int) -> None:
    async with await AsyncConnection.connect(url) as conn:
        for position in range(1, count + 1):
            await conn.execute(
                "INSERT INTO journal (position, event_id, kind, public, org_id, corpus_id, subject_type, subject_id,"
                " payload) VALUES (%s, %s, 'record.accepted', true, %s, %s, 'record', %s, '{}')",
                (position, f"evt_{position}", ORG, CORPUS, f"rec_{position}"))
        await conn.execute("INSERT INTO projector_checkpoints (name, position) VALUES (%s, %s)"
                           " ON CONFLICT (name) DO UPDATE SET position = excluded.position", (FEED_PROJECTOR, count))
        await conn.commit()


def with_pool(databases, events: int, scenario) -> None:
    """scenario(pool, url) on a fresh database holding `events` public events, all in the feed."""
    url = databases.create()

    async def run():
        await with_public_events(url, events)
        async with async_pool(url, max_size=16) as pool:
            await scenario(pool, url)
    asyncio.run(run())


def test_streams_at_one_position_share_one_read(databases):
    async def scenario(pool, _url):
        pages = StreamPages(pool)
        pool.pop_stats()
        # Twenty streams caught up at position 0, woken by the same announcement (count 7).
        answers = await asyncio.gather(*(pages.read(ORG, CORPUS, 0, [], announced=7) for _ in range(20)))
        assert all(answer is answers[0] for answer in answers)
        events, next_position = answers[0]
        assert [position for position, _ in events] == [1, 2, 3] and next_position == 3
        assert pool.pop_stats().get("requests_num") == 1  # one pooled connection for all twenty

        # A stream woken by a later announcement never takes a read started before it: that read
        # may not show the commit it was woken for.
        earlier, later = await asyncio.gather(pages.read(ORG, CORPUS, 0, [], announced=8),
                                              pages.read(ORG, CORPUS, 0, [], announced=9))
        assert earlier is not later and earlier == later
    with_pool(databases, 3, scenario)


def test_a_stream_that_hangs_up_leaves_the_others_their_page(databases):
    async def scenario(pool, _url):
        pages = StreamPages(pool)
        first = asyncio.create_task(pages.read(ORG, CORPUS, 0, [], announced=1))
        await asyncio.sleep(0)  # the first stream's read is under way
        others = [asyncio.create_task(pages.read(ORG, CORPUS, 0, [], announced=1)) for _ in range(4)]
        first.cancel()  # its client went away mid-read
        answers = await asyncio.gather(*others)
        assert all([position for position, _ in events] == [1, 2] for events, _ in answers)
        assert first.cancelled()
    with_pool(databases, 2, scenario)


async def reads_waiting_on(conn: AsyncConnection, table: str) -> int:
    return (await (await conn.execute(LOCK_WAITERS, (table,))).fetchone())[0]


def test_streams_hold_at_most_four_pooled_connections(databases):
    async def scenario(pool, url):
        async with await AsyncConnection.connect(url) as locker:
            pages = StreamPages(pool, at_once=4)
            # Every page read waits while the feed's head is locked: a read that got a connection keeps it.
            await locker.execute("LOCK TABLE projector_checkpoints IN ACCESS EXCLUSIVE MODE")
            reads = [asyncio.create_task(pages.read(ORG, CORPUS, after, [], announced=1)) for after in range(20)]
            deadline = time.monotonic() + 20
            while await reads_waiting_on(locker, "projector_checkpoints") < 4:
                assert time.monotonic() < deadline, "timed out waiting for four reads on the lock"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # time for more to arrive, were they allowed to
            assert await reads_waiting_on(locker, "projector_checkpoints") == 4
            assert pool.get_stats()["pool_size"] <= 4 + 1  # four readers, and at most one connection on its way
            await locker.rollback()
            answers = await asyncio.gather(*reads)
            assert [len(events) for events, _ in answers] == [1] + [0] * 19
    with_pool(databases, 1, scenario)
