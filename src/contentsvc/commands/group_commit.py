"""Group commit: concurrent single ingests (or withdrawals) of one key share one transaction.

Each command is checked on its own, exactly as the entries of a batch are (a refusal answers
only its own request), and the accepted ones are appended together: one journal append and one
commit instead of one per request. Appends serialize on the journal lock anyway, so nothing is
lost by waiting: while a key's transaction is in flight, the commands that arrive for that key
queue up, and the next transaction takes all of them. A lone request goes at once.

Order and idempotency are those of the requests run one after another in arrival order: two
commands with the same idempotency key in one group are the first request and its replay (or
an `idempotency_conflict`), as in a batch. A database failure fails every request of its group
with the same answer (503), as it would have failed each of them alone.
"""

from __future__ import annotations

import asyncio

from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import Principal
from contentsvc.commands.records import Accepted, SourceCommand, accept_source_commands
from contentsvc.domain.errors import ApiError

MAX_GROUP = 100  # commands per transaction: a batch's size

Waiting = list[tuple[SourceCommand, asyncio.Future]]


class SingleCommandGroups:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        # (Principal, family) -> commands not yet taken: one key's requests, as it authorized them.
        self._queues: dict[tuple[Principal, str], Waiting] = {}
        # The leader of each key that has one; held here, as the event loop keeps only weak references.
        self._leaders: dict[tuple[Principal, str], asyncio.Task] = {}

    async def accept(self, p: Principal, cmd: SourceCommand, family: str) -> Accepted | ApiError:
        key = (p, family)
        outcome: asyncio.Future = asyncio.get_running_loop().create_future()
        outcome.add_done_callback(_retrieved)  # a request that went away leaves its outcome unread
        self._queues.setdefault(key, []).append((cmd, outcome))
        if key not in self._leaders:
            # Not this request's task: a client that goes away must not take the others' commit along.
            self._leaders[key] = asyncio.create_task(self._lead(key))
        return await asyncio.shield(outcome)

    async def _lead(self, key: tuple[Principal, str]) -> None:
        try:
            while (waiting := self._queues.pop(key, None)) is not None:
                if len(waiting) > MAX_GROUP:
                    self._queues[key] = waiting[MAX_GROUP:]
                await self._commit(*key, waiting[:MAX_GROUP])
        finally:
            del self._leaders[key]

    async def _commit(self, p: Principal, family: str, taken: Waiting) -> None:
        try:
            async with self.pool.connection() as conn:
                results = await accept_source_commands(conn, p, [cmd for cmd, _ in taken], family)
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
