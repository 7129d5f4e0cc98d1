"""The API's key cache (decisions.md Keys): served only while listening, cleared by every
announced change, and never refilled with a Principal read before a clear."""

from __future__ import annotations

import asyncio

from contentsvc.auth.cache import PrincipalCache
from contentsvc.auth.principal import Principal

KEY = Principal(key_id="key_1", org_id="org", actions=frozenset({"content:read"}), corpora=None)


class Table:
    """What the database answers for the secret, and how often it was asked."""

    def __init__(self, principal):
        self.principal, self.reads = principal, 0

    async def read(self, digest: bytes):
        self.reads += 1
        return self.principal


def run(coroutine):
    return asyncio.run(coroutine)


def test_a_listening_cache_reads_a_key_once():
    cache, table = PrincipalCache(), Table(KEY)
    cache.listening_started()
    for _ in range(3):
        assert run(cache.principal("csk_secret", table.read)) == KEY
    assert table.reads == 1


def test_a_clear_makes_the_next_request_read_the_table():
    cache, table = PrincipalCache(), Table(KEY)
    cache.listening_started()
    run(cache.principal("csk_secret", table.read))
    cache.clear()  # a revocation was announced
    table.principal = None
    assert run(cache.principal("csk_secret", table.read)) is None
    assert run(cache.principal("csk_secret", table.read)) is None and table.reads == 3  # refusals are not cached


def test_nothing_is_cached_while_not_listening():
    cache, table = PrincipalCache(), Table(KEY)
    for _ in range(2):
        run(cache.principal("csk_secret", table.read))
    cache.listening_started()
    run(cache.principal("csk_secret", table.read))
    cache.listening_lost()
    run(cache.principal("csk_secret", table.read))
    assert table.reads == 4


def test_a_read_that_straddles_a_clear_is_not_stored():
    cache = PrincipalCache()
    cache.listening_started()

    async def read_then_revoked(digest: bytes):
        principal = KEY
        cache.clear()  # the revocation's notice arrives while this request reads the table
        return principal

    async def scenario():
        assert await cache.principal("csk_secret", read_then_revoked) == KEY  # this request began before it
        table = Table(None)
        assert await cache.principal("csk_secret", table.read) is None and table.reads == 1

    run(scenario())


def test_forgetting_one_entry_keeps_the_others_and_stops_a_straddling_read():
    # storage/notified_cache.py: the pushed-to Connectors' cache drops one Connector per announcement
    from contentsvc.storage.notified_cache import NotifiedCache

    cache: NotifiedCache[str, str] = NotifiedCache(max_entries=10)
    cache.listening_started()
    reads: list[str] = []

    async def read(key: str) -> str:
        reads.append(key)
        return f"row of {key}"

    async def read_then_changed(key: str) -> str:
        cache.forget(key)  # its change is announced while this request reads it
        return "stale row"

    async def scenario():
        await cache.get("a", read)
        await cache.get("b", read)
        cache.forget("a")
        await cache.get("a", read)
        await cache.get("b", read)
        assert reads == ["a", "b", "a"]
        assert await cache.get("c", read_then_changed) == "stale row"
        assert await cache.get("c", read) == "row of c" and reads[-1] == "c"

    run(scenario())
