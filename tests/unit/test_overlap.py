"""contentsvc.overlap: work done while a coroutine waits, and nothing left running after a failure
(the lexical replay's read-ahead and a search's hydration rely on both)."""

from __future__ import annotations

import asyncio

import pytest

from contentsvc.overlap import overlapped


def test_the_work_runs_while_the_awaitable_waits_and_its_result_is_returned():
    order = []

    async def query():
        order.append("sent")
        await asyncio.sleep(0.01)  # the answer is on its way
        order.append("answered")
        return 42

    assert asyncio.run(overlapped(query(), lambda: order.append("work"))) == 42
    assert order == ["sent", "work", "answered"]


def test_a_failed_work_cancels_the_awaitable_before_the_error_leaves():
    state = {}

    async def query():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise

    def work():
        raise ValueError("indexing failed")

    async def main():
        with pytest.raises(ValueError, match="indexing failed"):
            await overlapped(query(), work)
        assert state == {"cancelled": True}
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(main())
