"""The ingest backlog's reading (api/backlog.py): at most one read of the journal per second,
shared by the requests that arrive meanwhile, and a refusal only above the limit. The read itself
runs against PostgreSQL in tests/e2e/test_ingest_backlog.py; here a stand-in pool answers a
chosen age and counts how often it is asked."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

from contentsvc.api import backlog
from contentsvc.api.backlog import IngestBacklog
from contentsvc.domain.errors import ApiError


class AgeSource:
    """A pool whose one connection answers the age of the oldest unfolded event."""

    def __init__(self, age: float) -> None:
        self.age, self.reads = age, 0

    @asynccontextmanager
    async def connection(self):
        self.reads += 1
        await asyncio.sleep(0.01)  # a round trip, during which other requests arrive
        yield self

    async def execute(self, sql: str, params=None):
        self.asked = sql
        return self

    async def fetchone(self):
        if "search_generations" in self.asked:
            return None  # no serving lexical generation yet
        return (self.age,)


def test_concurrent_ingests_share_one_read_per_second():
    source = AgeSource(0.5)
    limit = IngestBacklog(source, max_seconds=60)

    async def burst():
        await asyncio.gather(*(limit.refuse_when_behind() for _ in range(50)))
        await asyncio.gather(*(limit.refuse_when_behind() for _ in range(50)))

    asyncio.run(burst())
    assert source.reads == 1


def test_a_backlog_older_than_the_limit_is_429_with_retry_after(monkeypatch):
    source = AgeSource(61.0)
    limit = IngestBacklog(source, max_seconds=60)
    with pytest.raises(ApiError) as refused:
        asyncio.run(limit.refuse_when_behind())
    assert refused.value.status == 429 and refused.value.code == "ingest_backlog" and refused.value.retryable
    assert refused.value.headers == {"Retry-After": str(backlog.RETRY_AFTER_SECONDS)}

    # Caught up: the next read, a second later, accepts again.
    source.age = 0.2
    monkeypatch.setattr(backlog, "REFRESH_SECONDS", 0.0)
    asyncio.run(limit.refuse_when_behind())
    assert source.reads == 2


def test_a_limit_of_zero_never_reads_nor_refuses():
    source = AgeSource(10_000.0)
    asyncio.run(IngestBacklog(source, max_seconds=0).refuse_when_behind())
    assert source.reads == 0
