"""Canonical form of a request, for idempotency.

Two requests are "the same" when their decoded values are equal: member
order, white space and spelled-out defaults do not matter; every value,
including string content, does. The idempotency key itself is not part of
the request it names.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec


def canonical_bytes(value: Any, *, exclude: tuple[str, ...] = ("idempotency_key",)) -> bytes:
    builtins = msgspec.to_builtins(value)
    if isinstance(builtins, dict):
        builtins = {k: v for k, v in builtins.items() if k not in exclude}
    return msgspec.json.encode(builtins, order="sorted")


def request_digest(value: Any, **context: str) -> bytes:
    """SHA-256 of the canonical request plus route context (path ids)."""
    h = hashlib.sha256(canonical_bytes(value))
    for name in sorted(context):
        h.update(b"\x00" + name.encode() + b"=" + context[name].encode())
    return h.digest()
