"""The notification webhook's bytes: the WebhookEvent body and the Standard Webhooks v1 headers
(decisions-part2, "WebhookEvent and signing"). Pure functions: no clock, no I/O.

The body is built once, when the Delivery is created, and stored; every attempt sends those
exact bytes (byte-identical across attempts), so only `webhook-timestamp` and the signature
change from one attempt to the next.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import msgspec
from msgspec import UNSET, UnsetType

from contentsvc import __version__
from contentsvc.config.settings import DestinationSettings

USER_AGENT = f"contentsvc-webhooks/{__version__}"
SECRET_PREFIX = "whsec_"


class WebhookEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The body, members in the contract's order (msgspec encodes fields in declaration order)."""

    event_id: str  # = webhook-id, a wev_ id
    type: str  # the Delivery's event_type
    created_at: str  # the notice's commit time, RFC 3339 UTC
    subscription_id: str
    subscription_version_id: str
    saved_query_id: str
    saved_query_version_id: str
    match_id: str
    corpus_id: str
    record_id: str
    version_id: str
    owner: str | UnsetType = UNSET  # only when the Subscription has one


_encoder = msgspec.json.Encoder()


def webhook_body(event: WebhookEvent) -> bytes:
    """Compact JSON in member order; the same event always gives the same bytes."""
    return _encoder.encode(event)


def secret_key(secret: str) -> bytes:
    """The HMAC key of a `whsec_<base64>` secret."""
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def sign(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64 HMAC-SHA256>` over id "." timestamp "." raw body."""
    signed = webhook_id.encode() + b"." + str(timestamp).encode() + b"." + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signature_header(destination: DestinationSettings, webhook_id: str, timestamp: int, body: bytes) -> str:
    """The current secret's signature, then (during a rotation) the previous secret's, one space apart."""
    signatures = [sign(destination.secret, webhook_id, timestamp, body)]
    if destination.previous_secret is not None:
        signatures.append(sign(destination.previous_secret, webhook_id, timestamp, body))
    return " ".join(signatures)


def request_headers(destination: DestinationSettings, webhook_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header of one attempt. The destination's own headers cannot name content-type, host,
    content-length or webhook-* (refused at start, config/plugins.py), so none is overridden."""
    headers = {"content-type": "application/json", "user-agent": USER_AGENT}
    headers.update(destination.headers)
    headers["webhook-id"] = webhook_id
    headers["webhook-timestamp"] = str(timestamp)
    headers["webhook-signature"] = signature_header(destination, webhook_id, timestamp, body)
    return headers
