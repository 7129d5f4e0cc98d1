"""Idempotency records: claimed in the command's own transaction.

A claim inserts (org, family, key) with the request digest and the resource
the command will produce. A key already present replays that resource when
the digest matches, else 409 idempotency_conflict. Keys are inserted in
sorted order so that concurrent batches sharing keys cannot deadlock; a
concurrent duplicate waits on the unique index and then replays.
"""

from __future__ import annotations

from dataclasses import dataclass

from psycopg import AsyncConnection

from contentsvc.domain.errors import ApiError

# Route families (part 1: ingest and batch entries share one; withdrawals have their own).
INGEST = "ingest"
WITHDRAWAL = "withdrawal"
CORPORA = "corpora"
UPLOADS = "uploads"
UPLOAD_CONFIRM = "upload_confirm"


@dataclass(frozen=True)
class Claim:
    key: str
    digest: bytes
    status: int
    resource_type: str
    resource_id: str


@dataclass(frozen=True)
class Prior:
    """A key already used: what it produced."""

    status: int
    resource_type: str
    resource_id: str


def conflict() -> ApiError:
    return ApiError(
        409, "idempotency_conflict", "This idempotency_key was already used with a different request.",
        field="/idempotency_key",
    )


async def claim_one(conn: AsyncConnection, org_id: str, family: str, key: str, digest: bytes, status: int,
                    resource_type: str, resource_id: str) -> str | None:
    """Claim one key: None when fresh, the resource it produced before on a replay; a conflict raises."""
    prior = (await claim(conn, org_id, family, [Claim(key, digest, status, resource_type, resource_id)])).get(key)
    if isinstance(prior, ApiError):
        raise prior
    return None if prior is None else prior.resource_id


async def claim(conn: AsyncConnection, org_id: str, family: str, claims: list[Claim]) -> dict[str, Prior | ApiError]:
    """Claim keys; returns, for keys used before, the prior result or a conflict.

    Keys absent from the result are newly claimed by this transaction.
    """
    if not claims:
        return {}
    ordered = sorted(claims, key=lambda c: c.key)
    cur = await conn.execute(
        "INSERT INTO idempotency_keys (org_id, family, key, request_digest, status, resource_type, resource_id)"
        " SELECT %s, %s, k, d, s, t, i FROM unnest(%b::text[], %b::bytea[], %b::int[], %b::text[], %b::text[])"
        "   AS c(k, d, s, t, i)"
        " ON CONFLICT DO NOTHING RETURNING key",
        (
            org_id,
            family,
            [c.key for c in ordered],
            [c.digest for c in ordered],
            [c.status for c in ordered],
            [c.resource_type for c in ordered],
            [c.resource_id for c in ordered],
        ),
    )
    fresh = {r[0] for r in await cur.fetchall()}
    used = [c for c in ordered if c.key not in fresh]
    if not used:
        return {}
    cur = await conn.execute(
        "SELECT key, request_digest, status, resource_type, resource_id FROM idempotency_keys"
        " WHERE org_id = %s AND family = %s AND key = ANY(%s)",
        (org_id, family, [c.key for c in used]),
    )
    rows = {r[0]: r for r in await cur.fetchall()}
    out: dict[str, Prior | ApiError] = {}
    for c in used:
        row = rows[c.key]
        out[c.key] = Prior(row[2], row[3], row[4]) if bytes(row[1]) == c.digest else conflict()
    return out
