"""Single ingests (or withdrawals) of one key share one transaction (storage/group_commit.py).

Each command is checked on its own, exactly as the entries of a batch are (a refusal answers only
its own request), and the accepted ones are appended together: one journal append and one commit
instead of one per request. Order and idempotency are those of the requests run one after another
in arrival order: two commands with the same idempotency key in one group are the first request
and its replay (or an `idempotency_conflict`), as in a batch. A database failure fails every
request of its group with the same answer (503), as it would have failed each of them alone.
"""

from __future__ import annotations

from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import Principal
from contentsvc.commands.records import Accepted, SourceCommand, accept_source_commands
from contentsvc.domain.errors import ApiError
from contentsvc.storage.group_commit import GroupCommit


class SingleCommandGroups:
    """Single ingests and withdrawals grouped by Principal: one key's requests, as it authorized them,
    accepted in arrival order."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._groups: GroupCommit[Principal, SourceCommand, Accepted | ApiError] = GroupCommit(self._accept)

    async def accept(self, p: Principal, cmd: SourceCommand) -> Accepted | ApiError:
        return await self._groups.submit(p, cmd)

    async def _accept(self, principal: Principal, commands: list[SourceCommand]) -> list[Accepted | ApiError]:
        async with self.pool.connection() as conn:
            return await accept_source_commands(conn, principal, commands)
