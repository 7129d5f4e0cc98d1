"""How operator commands put counts into words: shared by `contentsvc worker status` and the
workers that describe their own queues to it (each worker's `waiting`)."""

from __future__ import annotations

from datetime import timedelta


def counted(count: int, noun: str, plural: str | None = None) -> str:
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def oldest_due(delay: timedelta | None) -> str:
    """`, the oldest due N s ago` for the oldest item past its time; empty when none is."""
    return "" if delay is None else f", the oldest due {max(0, round(delay.total_seconds())):,} s ago"
