"""Rows an API process keeps in memory because a trigger announces every change to them.

A change must still be seen by the next request. Each cached table's changes are announced
(`pg_notify`, from a trigger, so that every path is covered), and the API's listening
connection drops the entry, or everything, when an announcement arrives: normally within a
millisecond of the commit. The cache serves only while that connection listens: from its loss
until it listens again (and clears once more, for changes announced meanwhile), every request
reads the database.

A request that read the database before a change was announced must not put the stale value
back afterwards: it remembers the cache's epoch before reading, and stores only if nothing was
dropped since.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class NotifiedCache(Generic[K, V]):
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries  # past it the cache starts again empty
        self._values: dict[K, V] = {}
        self._epoch = 0
        self.listening = False

    def clear(self) -> None:
        self._epoch += 1
        self._values = {}

    def forget(self, key: K) -> None:
        self._epoch += 1
        self._values.pop(key, None)

    def listening_started(self) -> None:
        self.clear()
        self.listening = True

    def listening_lost(self) -> None:
        self.listening = False
        self.clear()

    async def get(self, key: K, read: Callable[[K], Awaitable[V | None]]) -> V | None:
        """The value of `key`: cached, or read (None, meaning there is none, is never cached)."""
        if self.listening and (cached := self._values.get(key)) is not None:
            return cached
        epoch = self._epoch
        value = await read(key)
        if value is not None and self.listening and epoch == self._epoch:
            if len(self._values) >= self.max_entries:
                self._values = {}
            self._values[key] = value
        return value
