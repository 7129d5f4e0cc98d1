"""Group commit: concurrent requests under one key share one transaction.

Appends serialize on the journal lock anyway, so nothing is lost by waiting: while a key's
transaction is in flight, the requests that arrive for that key queue up, and the next
transaction takes all of them (at most MAX_GROUP). A lone request goes at once. Each request
still gets its own answer; a failure of the shared transaction (a database error) is every
request's answer, as it would have been each one's alone.

Used by single ingests (commands/group_commit.py), pushed items with their audit
(connectors/push_ingests.py) and the push routes' other audits (connectors/push_store.py).
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

MAX_GROUP = 100  # requests per transaction: a batch's size

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[K, T, R]):
    """`commit(key, items)` answers a group's items in order, in one transaction of its own."""

    def __init__(self, commit: Callable[[K, list[T]], Awaitable[list[R]]]) -> None:
        self._commit_group = commit
        self._queues: dict[K, list[tuple[T, asyncio.Future]]] = {}  # key -> requests not yet taken
        # The leader of each key that has one; held here, as the event loop keeps only weak references.
        self._leaders: dict[K, asyncio.Task] = {}

    async def submit(self, key: K, item: T) -> R:
        outcome: asyncio.Future = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_retrieved)  # a request that went away leaves its outcome unread
        self._queues.setdefault(key, []).append((item, outcome))
        if key not in self._leaders:
            # Not this request's task: a client that goes away must not take the others' commit along.
            self._leaders[key] = asyncio.create_task(self._lead(key))
        return await asyncio.shield(outcome)

    async def _lead(self, key: K) -> None:
        try:
            while (waiting := self._queues.pop(key, None)) is not None:
                if len(waiting) > MAX_GROUP:
                    self._queues[key] = waiting[MAX_GROUP:]
                await self._commit(key, waiting[:MAX_GROUP])
        finally:
            del self._leaders[key]

    async def _commit(self, key: K, taken: list[tuple[T, asyncio.Future]]) -> None:
        try:
            results = await self._commit_group(key, [item for item, _ in taken])
        except BaseException as exc:  # noqa: BLE001 - every request of the group gets the same answer
            for _, outcome in taken:
                if not outcome.done():
                    outcome.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, outcome), result in zip(taken, results):
            if not outcome.done():
                outcome.set_result(result)



def _retrieved(outcome: asyncio.Future) -> None:
    if not outcome.cancelled():
        outcome.exception()
