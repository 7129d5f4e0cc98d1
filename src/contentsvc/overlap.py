"""Synchronous work done while a coroutine waits on I/O (a query sent to PostgreSQL, say)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")


async def overlapped(awaitable: Awaitable[T], work: Callable[[], object]) -> T:
    """The result of `awaitable`, with `work()` done while it waits: it runs as a task up to its
    first wait (its query sent), then `work` holds the event loop, then the task is awaited. If
    `work` fails or the caller is cancelled (a deadline), the task is cancelled and awaited
    first, so that nothing is left running on a connection the caller is about to give back."""
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.sleep(0)
        work()
        return await task
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
