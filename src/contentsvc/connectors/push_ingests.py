"""The items of concurrent pushes to one Connector accepted in one transaction, with the audit of
the pushes they answer (part 2 "Declared push route" rules 7 and 11).

A push whose items are all newly accepted is answered 202 with nothing read or written after its
items, provided it has no Idempotency-Key answer to keep and push health is already `active` (the
caller decides that). Its `connector.push.received` event and counters are then written in the
transaction that accepts the items: one commit and one turn at the journal lock per group instead
of two, and the audit is still committed before the answer leaves, as rule 11 asks. Any other
push (a refused item: 422; a replayed item, whose Receipt is read again) is audited on its own
afterwards, as every refusal is.

Groups form as in storage/group_commit.py, per Connector (its Principal); a push's items stay
together in one transaction, ingests and withdrawals in their order.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import Principal
from contentsvc.commands.records import Accepted, SourceCommand, accept_in_transaction
from contentsvc.connectors.push_store import Attempt, write_attempts
from contentsvc.domain.errors import ApiError
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.storage.group_commit import GroupCommit


@dataclass(frozen=True)
class PushedItems:
    """One push's commands (refused items already ApiErrors), and its audit entry when it may be
    recorded together with them (None: the caller records it)."""

    commands: list[SourceCommand | ApiError]
    received: Attempt | None = None


@dataclass(frozen=True)
class Delivered:
    results: list[Accepted | ApiError]  # in command order
    audited: bool  # the push's `received` audit committed with its items


class PushIngests:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._groups: GroupCommit[Principal, PushedItems, Delivered] = GroupCommit(self._commit)

    async def accept(self, principal: Principal, pushed: PushedItems) -> Delivered:
        return await self._groups.submit(principal, pushed)

    async def _commit(self, principal: Principal, pushes: list[PushedItems]) -> list[Delivered]:
        async with self.pool.connection() as conn, journal_transaction(conn):
            results = await accept_in_transaction(conn, principal, [c for p in pushes for c in p.commands])
            delivered, start = [], 0
            for push in pushes:
                own = results[start:start + len(push.commands)]
                start += len(push.commands)
                delivered.append(Delivered(own, push.received is not None
                                           and all(isinstance(r, Accepted) and not r.replayed for r in own)))
            received = [p.received for p, d in zip(pushes, delivered) if d.audited]
            if received:
                await write_attempts(conn, received)
        return delivered
