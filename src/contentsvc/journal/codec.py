"""The journal boundary: payload Structs become JSON here, and JSON becomes Structs here.

Nothing else encodes or decodes a payload. Reads fetch the jsonb column as
its raw bytes and decode them straight into the Struct of the row's kind
(one pass, no intermediate dict).
"""

from __future__ import annotations

import msgspec
from psycopg.abc import AdaptContext
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from contentsvc.journal.events import PAYLOAD_TYPES, EventPayload, Payload

_encoder = msgspec.json.Encoder()
_decoders = {kind: msgspec.json.Decoder(t) for kind, t in PAYLOAD_TYPES.items()}


def encode_payload(payload: EventPayload) -> bytes:
    return _encoder.encode(payload)


def jsonb_payload(payload: EventPayload) -> Jsonb:
    """A payload as a jsonb query parameter."""
    return Jsonb(payload, dumps=encode_payload)


def decode_payload(kind: str, data: bytes | str) -> Payload | msgspec.Raw:
    """The payload of an event of `kind`; a kind outside the catalogue stays raw JSON."""
    decoder = _decoders.get(kind)
    return decoder.decode(data) if decoder is not None else msgspec.Raw(data)


class _JsonbText(Loader):
    def load(self, data) -> bytes:
        return bytes(data)


class _JsonbBinary(Loader):
    format = Format.BINARY

    def load(self, data) -> bytes:
        return bytes(data[1:])  # after the jsonb format version byte


def fetch_payloads_raw(context: AdaptContext) -> None:
    """jsonb columns read through `context` (a cursor or connection) arrive as undecoded bytes,
    for decode_payload."""
    context.adapters.register_loader("jsonb", _JsonbText)
    context.adapters.register_loader("jsonb", _JsonbBinary)
