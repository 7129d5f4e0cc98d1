"""Journal ordering under concurrency (design.md: positions seen in commit order, never skipped).

Many writers append concurrently while readers follow the journal the way
projectors and the change feed do: read after the last position seen. If a
transaction could commit a position below one a reader had already passed,
that reader would miss the event. Every reader must see every event exactly
once, in increasing position order.
"""

import asyncio
import socket

import msgspec
import psycopg
from hypothesis import HealthCheck, given, settings, strategies as st

from contentsvc.journal.events import EventPayload, NewEvent


class Appended(EventPayload, kw_only=True, tag="test.appended"):
    """A kind outside the catalogue: the journal carries it all the same."""

    w: int
    n: int
    i: int
from contentsvc.journal.store import append, head, read_after, transaction


async def _writer(url: str, writer: int, batches: list[int], appended: list[str]) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for n, size in enumerate(batches):
            events = [
                NewEvent(org_id="order-test", subject_type="test", subject_id=f"w{writer}-{n}-{i}",
                         payload=Appended(w=writer, n=n, i=i))
                for i in range(size)
            ]
            async with transaction(conn):
                await append(conn, events)
            appended.extend(e.event_id for e in events)
            await asyncio.sleep(0)


async def _reader(url: str, start: int, done: asyncio.Event, seen: list[tuple[int, str]]) -> None:
    position = start
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            finished = done.is_set()
            events = await read_after(conn, position, 50)
            for e in events:
                seen.append((e.position, e.event_id))
            if events:
                position = events[-1].position
            elif finished:
                return
            else:
                await asyncio.sleep(0)


async def _scenario(url: str, writers: list[list[int]], readers: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        start = await head(conn)
    appended: list[str] = []
    done = asyncio.Event()
    seen_by = [[] for _ in range(readers)]
    reading = [asyncio.create_task(_reader(url, start, done, seen)) for seen in seen_by]
    await asyncio.gather(*(_writer(url, w, b, appended) for w, b in enumerate(writers)))
    done.set()
    await asyncio.gather(*reading)
    for seen in seen_by:
        positions = [p for p, _ in seen]
        assert positions == sorted(positions), "a reader saw positions out of order"
        assert len(set(positions)) == len(positions), "a reader saw an event twice"
        assert sorted(e for _, e in seen) == sorted(appended), "a reader missed an event"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writers=st.lists(st.lists(st.integers(1, 20), min_size=5, max_size=25), min_size=2, max_size=8),
    readers=st.integers(1, 4),
)
def test_every_reader_sees_every_event_once_in_order(database_url, writers, readers):
    asyncio.run(_scenario(database_url, writers, readers))


def test_journal_is_append_only(database_url):
    with psycopg.connect(database_url) as conn:
        try:
            conn.execute("UPDATE journal SET kind = kind")
        except psycopg.errors.RaiseException as exc:
            assert "append-only" in str(exc)
        else:
            raise AssertionError("an UPDATE of the journal was allowed")


class ConnectorTouched(EventPayload, kw_only=True, tag="connectortest.touched"):
    """A kind of its own family, `connectortest`."""

    n: int


def test_an_append_notifies_every_listener_and_its_families_channels(database_url):
    # schema/025: contentsvc_journal for every append, contentsvc_journal_FAMILY once per family.
    with psycopg.connect(database_url, autocommit=True) as listener:
        for channel in ("contentsvc_journal", "contentsvc_journal_connectortest", "contentsvc_journal_test"):
            listener.execute(f"LISTEN {channel}")

        async def append_both():
            async with await psycopg.AsyncConnection.connect(database_url) as conn:
                async with transaction(conn):
                    await append(conn, [NewEvent(org_id="wake-test", subject_type="test", subject_id=f"s{i}",
                                                 payload=payload) for i, payload in
                                        enumerate([ConnectorTouched(n=1), ConnectorTouched(n=2),
                                                   Appended(w=0, n=0, i=0)])])

        asyncio.run(append_both())
        channels = sorted(n.channel for n in listener.notifies(timeout=2.0, stop_after=3))
    assert channels == ["contentsvc_journal", "contentsvc_journal_connectortest", "contentsvc_journal_test"]


class Sized(EventPayload, kw_only=True, tag="test.sized"):
    text: str


async def _append_large(url: str, chars: int) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        # A send buffer of a few KiB: the socket takes a transaction of megabytes a little at a
        # time, as a busy server that reads slowly makes it do.
        sock = socket.socket(fileno=conn.pgconn.socket)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock.detach()
        event = NewEvent(org_id="order-test", subject_type="test", subject_id="large", payload=Sized(text="x" * chars))
        # Bounded: a transaction that never ends fails the test instead of hanging the suite.
        async with asyncio.timeout(60):
            async with transaction(conn):
                await append(conn, [event])
        [appended] = await read_after(conn, await head(conn) - 1, 1)
        assert appended.event_id == event.event_id
        return len(msgspec.json.decode(appended.payload)["text"])  # a kind outside the catalogue: raw


def test_a_transaction_of_megabytes_commits_through_a_slow_socket(database_url):
    # design.md: every command appends to the journal; a fold's batch of Versions carries their
    # texts. psycopg's commit() in pipeline mode waited for results without sending the rest of
    # the pipeline (it hung on every try); COMMIT is sent as a statement of the pipeline instead.
    assert asyncio.run(_append_large(database_url, 4_000_000)) == 4_000_000
