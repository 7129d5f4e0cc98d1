"""Group commit (storage/group_commit.py): concurrent requests under one key share one commit,
each answered on its own, in arrival order; a failed commit answers its own group only."""

from __future__ import annotations

import asyncio

import pytest

from contentsvc.storage.group_commit import MAX_GROUP, GroupCommit


class Ledger:
    """A commit function that records the groups it was given and can be held or made to fail."""

    def __init__(self) -> None:
        self.groups: list[tuple[str, list[int]]] = []
        self.release = asyncio.Event()
        self.fail_next = False

    async def commit(self, key: str, items: list[int]) -> list[int]:
        self.groups.append((key, items))
        await self.release.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the database went away")
        return [item * 10 for item in items]


def test_requests_arriving_during_a_commit_share_the_next_one_and_keep_their_order():
    async def scenario():
        ledger = Ledger()
        groups = GroupCommit(ledger.commit)
        first = asyncio.create_task(groups.submit("a", 1))
        await asyncio.sleep(0)  # the lone request goes at once
        later = [asyncio.create_task(groups.submit("a", n)) for n in range(2, 8)]
        other = asyncio.create_task(groups.submit("b", 99))  # another key is not held up by "a"
        await asyncio.sleep(0)
        ledger.release.set()
        return ledger.groups, await first, await asyncio.gather(*later), await other

    groups, first, later, other = asyncio.run(scenario())
    assert groups == [("a", [1]), ("b", [99]), ("a", [2, 3, 4, 5, 6, 7])]
    assert (first, later, other) == (10, [20, 30, 40, 50, 60, 70], 990)


def test_a_failed_commit_fails_its_own_group_only():
    async def scenario():
        ledger = Ledger()
        ledger.fail_next = True
        groups = GroupCommit(ledger.commit)
        doomed = [asyncio.create_task(groups.submit("a", n)) for n in (1, 2)]
        await asyncio.sleep(0)
        ledger.release.set()
        outcomes = await asyncio.gather(*doomed, return_exceptions=True)
        return outcomes, await groups.submit("a", 3)

    outcomes, after = asyncio.run(scenario())
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    assert after == 30


@pytest.mark.parametrize("waiting", [MAX_GROUP + 1, 2 * MAX_GROUP + 5])
def test_a_group_holds_at_most_max_group_requests(waiting):
    async def scenario():
        ledger = Ledger()
        ledger.release.set()
        groups = GroupCommit(ledger.commit)
        answers = await asyncio.gather(*(groups.submit("a", n) for n in range(waiting)))
        return ledger.groups, answers

    recorded, answers = asyncio.run(scenario())
    assert answers == [n * 10 for n in range(waiting)]
    assert all(len(items) <= MAX_GROUP for _, items in recorded)
    assert [n for _, items in recorded for n in items] == list(range(waiting))
