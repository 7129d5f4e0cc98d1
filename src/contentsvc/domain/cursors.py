"""Opaque, tamper-evident cursors.

A cursor is base64url(JSON payload || 16-byte HMAC-SHA256 tag). The payload
names what kind of cursor it is and what it is bound to (Organization,
filter, scope digest); routes compare those bindings with the request. The
HMAC key lives in the database so that every process shares it.

Every cursor error that tells a client to resynchronize (409
cursor_scope_changed, 410 cursor_expired) names the same place, the Record
catalog (part 1 rules 6 and 18): `resync_url` below.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any
from urllib.parse import quote

import msgspec

TAG_BYTES = 16


RECORD_CATALOG = "/v0/records"


def resync_url(corpus_id: str | None = None) -> str:
    """Where a client resynchronizes after a cursor error: the relative Record catalog route
    (part 1 rule 6), for the request's Corpus when it names one (rule 18). A corpora page cursor
    binds no Corpus, so its errors name the route itself: the client lists the Corpora again and
    rereads each one it mirrors from `/v0/records?corpus_id=...`."""
    if corpus_id is None:
        return RECORD_CATALOG
    return f"{RECORD_CATALOG}?corpus_id={quote(corpus_id, safe='')}"


class InvalidCursor(Exception):
    """Not a cursor this service issued (garbled, tampered, or another kind)."""


class CursorCodec:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _tag(self, payload: bytes) -> bytes:
        return hmac.new(self._secret, payload, hashlib.sha256).digest()[:TAG_BYTES]

    def encode(self, kind: str, /, **fields: Any) -> str:
        # kind is positional only: a listing's filters travel as fields, and one of them is `kind`
        payload = msgspec.json.encode({"k": kind, **fields}, order="sorted")
        return base64.urlsafe_b64encode(payload + self._tag(payload)).rstrip(b"=").decode()

    def decode(self, token: str, kind: str) -> dict[str, Any]:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (ValueError, TypeError):
            raise InvalidCursor("not base64url") from None
        if len(raw) <= TAG_BYTES:
            raise InvalidCursor("too short")
        payload, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
        if not hmac.compare_digest(tag, self._tag(payload)):
            raise InvalidCursor("bad tag")
        fields = msgspec.json.decode(payload)
        if not isinstance(fields, dict) or fields.get("k") != kind:
            raise InvalidCursor("another kind of cursor")
        return fields
