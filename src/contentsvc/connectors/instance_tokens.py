"""Instance tokens (decisions-part2 "Instance tokens"): a bearer secret scoped to one Connector,
valid only on its `instance_token` push routes while unrevoked, unexpired and the Connector
enabled. `cit_` + 32 random url-safe bytes, shown once; only its SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timezone
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.connectors import views
from contentsvc.connectors.shapes import InstanceToken, InstanceTokenCreate, connector_disabled
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.ids import new_id

PREFIX = "cit_"
MAX_UNREVOKED = 20


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def token_view(row: dict[str, Any], secret: str | None = None) -> InstanceToken:
    return InstanceToken(token_id=row["token_id"], connector_id=row["connector_id"], name=row["name"],
                         created_at=iso(row["created_at"]),
                         expires_at=iso(row["expires_at"]) if row["expires_at"] else None,
                         revoked_at=iso(row["revoked_at"]) if row["revoked_at"] else None, secret=secret)


async def _visible(conn: AsyncConnection, p: Principal, connector_id: str, lock: bool = False) -> dict[str, Any]:
    row = await views.visible_connector(conn, p, connector_id, lock)
    if row is None:
        raise not_found("connector")
    return row


async def create_token(conn: AsyncConnection, p: Principal, connector_id: str,
                       req: InstanceTokenCreate) -> tuple[InstanceToken, bool]:
    """(the token, with its secret only when new; replayed)."""
    async with conn.transaction():
        connector = await _visible(conn, p, connector_id, lock=True)
        if not connector["enabled"]:
            raise connector_disabled()
        token_id = new_id("citk")
        prior = await idempotency.claim_one(conn, p.org_id, f"instance_token:{connector_id}", req.idempotency_key,
                                            request_digest(req, connector=connector_id), 201, "instance_token",
                                            token_id)
        cur = conn.cursor(row_factory=dict_row)
        if prior is not None:
            await cur.execute("SELECT * FROM connector_instance_tokens WHERE token_id = %s", (prior,))
            return token_view(await cur.fetchone()), True
        count = await conn.execute("SELECT count(*) FROM connector_instance_tokens WHERE connector_id = %s"
                                   " AND revoked_at IS NULL", (connector_id,))
        if (await count.fetchone())[0] >= MAX_UNREVOKED:
            raise ApiError(409, "instance_token_limit", f"A Connector has at most {MAX_UNREVOKED} unrevoked tokens.")
        secret = PREFIX + secrets.token_urlsafe(32)
        expires = req.expires_at.replace(tzinfo=req.expires_at.tzinfo or timezone.utc) if req.expires_at else None
        await cur.execute(
            "INSERT INTO connector_instance_tokens (token_id, connector_id, org_id, name, secret_sha256, created_at,"
            " expires_at) VALUES (%s, %s, %s, %s, %s, now(), %s) RETURNING *",
            (token_id, connector_id, p.org_id, req.name, _digest(secret), expires))
        return token_view(await cur.fetchone(), secret), False


async def list_tokens(conn: AsyncConnection, p: Principal, connector_id: str) -> list[InstanceToken]:
    await _visible(conn, p, connector_id)
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute("SELECT * FROM connector_instance_tokens WHERE connector_id = %s ORDER BY token_id",
                      (connector_id,))
    return [token_view(r) for r in await cur.fetchall()]


async def revoke_token(conn: AsyncConnection, p: Principal, connector_id: str, token_id: str) -> InstanceToken:
    """Effective on the next request; a repeat answers the token as it is."""
    async with conn.transaction():
        await _visible(conn, p, connector_id)
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute("UPDATE connector_instance_tokens SET revoked_at = coalesce(revoked_at, now())"
                          " WHERE connector_id = %s AND token_id = %s RETURNING *", (connector_id, token_id))
        row = await cur.fetchone()
    if row is None:
        raise not_found("instance token")
    return token_view(row)


async def token_grants(conn: AsyncConnection, connector_id: str, secret: str | None) -> bool:
    """Whether `secret` is a live token of this Connector."""
    if not secret or not secret.startswith(PREFIX):
        return False
    cur = await conn.execute(
        "SELECT expires_at FROM connector_instance_tokens WHERE connector_id = %s AND secret_sha256 = %s"
        " AND revoked_at IS NULL", (connector_id, _digest(secret)))
    row = await cur.fetchone()
    return row is not None and (row[0] is None or row[0] > datetime.now(timezone.utc))
