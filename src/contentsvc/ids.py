"""Opaque, time-sortable identifiers (ULID layout) with a readable prefix.

Ids sort by creation time, so keyset pages in id order are creation order
(decisions.md). Within one process ids are strictly increasing even inside
one millisecond, which keeps a batch's Records in entry order.
"""

from __future__ import annotations

import os
import threading
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_lock = threading.Lock()
_last = 0


def _encode(value: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(out))


def new_ulid() -> str:
    global _last
    with _lock:
        candidate = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
        if candidate <= _last:
            candidate = _last + 1
        _last = candidate
    return _encode(candidate, 26)


def new_id(prefix: str) -> str:
    return f"{prefix}_{new_ulid()}"
