"""API keys: created by the operator, stored only as a SHA-256 of the secret.

A key's secret is `csk_` + 32 random url-safe bytes: high entropy, so a
plain SHA-256 is the right at-rest form (as for other bearer tokens); a slow
password hash would add nothing but latency to every request.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from dataclasses import dataclass

import psycopg

from contentsvc.domain.models import CORPUS_ID_PATTERN
from contentsvc.ids import new_id

ORGANIZATION_ACTIONS = (
    "content:read",
    "content:write",
    "blobs:read",
    "blobs:write",
    "operations:read",
    "operations:write",
    "corpora:read",
    "corpora:write",
    "projections:rebuild",
    "changes:read",
    "search:query",
    "monitoring:read",
    "monitoring:write",
    "connectors:read",
    "connectors:write",
    "connector:push",
    "observability:read",
)
OPERATOR_ACTIONS = ("plugins:admin",)
ORG_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"

SECRET_PREFIX = "csk_"
# Every change to api_keys is announced here (schema/024); the API's key cache clears on it.
KEYS_CHANNEL = "contentsvc_keys"
ANNOUNCED_WAIT_SECONDS = 2.0
ANNOUNCED_GRACE_SECONDS = 0.05


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class CreatedKey:
    key_id: str
    secret: str
    org: str
    actions: list[str]
    corpora: list[str] | str


def parse_actions(raw: str, operator: bool = False) -> list[str]:
    allowed = ORGANIZATION_ACTIONS + (OPERATOR_ACTIONS if operator else ())
    if raw.strip() == "*":
        return list(allowed)
    actions = [a.strip() for a in raw.split(",") if a.strip()]
    unknown = [a for a in actions if a not in allowed]
    if unknown:
        raise ValueError(f"unknown or not permitted action(s): {', '.join(unknown)}")
    if not actions:
        raise ValueError("at least one action is required")
    return sorted(set(actions))


def parse_org(raw: str) -> str:
    """An Organization id: what every access is scoped by, so never empty, and shown in logs
    and cursors, so no whitespace or control characters."""
    if not re.fullmatch(ORG_ID_PATTERN, raw):
        raise ValueError(f"--org {raw!r} is not an organization id: 1 to 63 letters, digits, '.', '_' or '-', "
                         "starting with a letter or digit")
    return raw


def parse_corpora(raw: str) -> list[str] | None:
    """None means every Corpus of the Organization, present and future. An id no Corpus can
    have is refused: a key scoped to it (`News` for `news`) would silently reach nothing."""
    if raw.strip() == "*":
        return None
    corpora = sorted({c.strip() for c in raw.split(",") if c.strip()})
    if not corpora:
        raise ValueError("at least one corpus id, or '*'")
    invalid = [c for c in corpora if not re.fullmatch(CORPUS_ID_PATTERN, c)]
    if invalid:
        raise ValueError(f"not a corpus id: {', '.join(invalid)} (lowercase letters, digits, '_' and '-', "
                         "at most 63)")
    return corpora


def create_key(
    conn: psycopg.Connection, org: str, actions: list[str], corpora: list[str] | None, name: str | None
) -> CreatedKey:
    key_id = new_id("key")
    secret = new_secret()
    conn.execute(
        "INSERT INTO api_keys (key_id, org_id, name, actions, corpora, secret_hash)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (key_id, org, name, actions, corpora, hash_secret(secret)),
    )
    return CreatedKey(key_id, secret, org, actions, "*" if corpora is None else corpora)


def list_keys(conn: psycopg.Connection) -> list[dict]:
    cur = conn.execute(
        "SELECT key_id, org_id, name, actions, corpora, created_at, revoked_at"
        " FROM api_keys ORDER BY created_at, key_id"
    )
    return [
        {
            "key_id": r[0],
            "org": r[1],
            "name": r[2],
            "actions": r[3],
            "corpora": "*" if r[4] is None else r[4],
            "created_at": r[5].isoformat(),
            "revoked_at": r[6].isoformat() if r[6] else None,
        }
        for r in cur.fetchall()
    ]


def revoke_key(conn: psycopg.Connection, key_id: str) -> bool:
    """Revoke the key; returns once the change is announced to the API processes, whose key
    caches clear on it (decisions.md Keys): a request sent afterwards is refused."""
    conn.execute(f"LISTEN {KEYS_CHANNEL}")
    cur = conn.execute(
        "UPDATE api_keys SET revoked_at = now() WHERE key_id = %s AND revoked_at IS NULL", (key_id,)
    )
    revoked = cur.rowcount == 1
    conn.commit()  # the trigger's announcement goes out with the commit (a no-op in autocommit)
    if revoked:
        # Our own copy of the announcement is back: every listening session has it queued. The
        # grace lets the API processes read theirs (they are sent at once on an idle connection).
        for _ in conn.notifies(timeout=ANNOUNCED_WAIT_SECONDS, stop_after=1):
            pass
        time.sleep(ANNOUNCED_GRACE_SECONDS)
    conn.execute(f"UNLISTEN {KEYS_CHANNEL}")
    conn.commit()
    return revoked
