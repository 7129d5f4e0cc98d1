"""Secrets at rest under the deployment's credential key (decisions-part2, "Credentials"):
AES-256-GCM, a 12-byte random nonce, associated data naming what the secret belongs to, stored
as `{key_id, nonce, ciphertext}` (base64). Opening picks the key by `key_id` among the current
`[connectors] credential_key` and `retired_credential_keys`, so a key can be rotated and the
stored secrets re-sealed later (`contentsvc credentials rewrap`).

Used for connector credentials and plugin tokens; the plaintext lives only in memory.
"""

from __future__ import annotations

import base64
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from contentsvc.config import Settings


class Unreadable(Exception):
    """No configured key opens it (retired and dropped, or the wrong associated data)."""


def keys(settings: Settings) -> tuple[str | None, dict[str, bytes]]:
    """(the current key id or None, every key that may open a secret by id)."""
    connectors = settings.connectors
    known = {key_id: base64.b64decode(key) for key_id, key in connectors.retired_credential_keys.items()}
    if connectors.credential_key:
        known[connectors.credential_key_id] = base64.b64decode(connectors.credential_key)
        return connectors.credential_key_id, known
    return None, known


def can_seal(settings: Settings) -> bool:
    return bool(settings.connectors.credential_key)


def seal(settings: Settings, plaintext: bytes, associated: bytes) -> dict[str, str]:
    key_id, known = keys(settings)
    if key_id is None:
        raise Unreadable("no credential key is configured")
    nonce = os.urandom(12)
    ciphertext = AESGCM(known[key_id]).encrypt(nonce, plaintext, associated)
    return {"key_id": key_id, "nonce": base64.b64encode(nonce).decode(),
            "ciphertext": base64.b64encode(ciphertext).decode()}


def unseal(settings: Settings, stored: dict, associated: bytes) -> bytes:
    key = keys(settings)[1].get(stored.get("key_id"))
    if key is None:
        raise Unreadable(f"no configured key has the id {stored.get('key_id')!r}")
    try:
        return AESGCM(key).decrypt(base64.b64decode(stored["nonce"]), base64.b64decode(stored["ciphertext"]),
                                   associated)
    except (InvalidTag, KeyError, ValueError) as exc:
        raise Unreadable("the sealed secret does not open with its key") from exc
