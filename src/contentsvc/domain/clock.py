"""Timestamps as the contract writes them: RFC 3339 in UTC with a Z."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def iso(ts: datetime | str) -> str:
    return ts if isinstance(ts, str) else ts.isoformat().replace("+00:00", "Z")
