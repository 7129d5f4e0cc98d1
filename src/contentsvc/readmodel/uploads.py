"""Reads of uploads and verified Blobs: the upload row (routes and commands) and the
verified Blobs an ingest may reference (part 1 rule 7)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.journal import events as ev


async def verified_blobs(conn: AsyncConnection, org_id: str, blob_ids: list[str]) -> dict[str, ev.VerifiedBlob]:
    """The verified Blobs among blob_ids, of this Organization only (possessing an id grants nothing).

    The rows stay share-locked until the caller's transaction ends: the collector marks a Blob
    collected under a row lock, so an ingest referencing it either commits first (and the
    collector then finds the reference) or waits and finds it collected (unverified_blob)."""
    cur = await conn.execute(
        "SELECT blob_id, sha256, size_bytes, storage_key FROM blobs WHERE org_id = %s AND blob_id = ANY(%s)"
        " AND collected_at IS NULL ORDER BY blob_id FOR SHARE",
        (org_id, blob_ids),
    )
    return {r[0]: ev.VerifiedBlob(sha256=r[1], size_bytes=r[2], storage_key=r[3]) for r in await cur.fetchall()}


async def hold_storage_key(conn: AsyncConnection, storage_key: str) -> None:
    """Take the content key's lock for the caller's transaction: a PUT that stores (or finds
    already stored) these bytes and the collector deleting them never interleave."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"blob:{storage_key}",))


UPLOAD_COLUMNS = """upload_id, org_id, blob_id, state, step, media_type, size_bytes, sha256, filename, expires_at,
                    created_at, received_size, received_sha256, storage_key, error"""


async def load_upload(conn: AsyncConnection, upload_id: str, org_id: str | None = None, *,
                      for_update: bool = False) -> dict[str, Any] | None:
    """The uploads row; org_id None only for the presigned PUT (its signature names the upload)."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        f"SELECT {UPLOAD_COLUMNS} FROM uploads WHERE upload_id = %s AND (%s::text IS NULL OR org_id = %s)"
        + (" FOR UPDATE" if for_update else ""),
        (upload_id, org_id, org_id),
    )
    return await cur.fetchone()


async def read_upload_secret(conn: AsyncConnection) -> bytes:
    """The key of the presigned PUT URLs (service_secrets `upload_hmac`): the API checks them, the
    connectors worker signs the grants it hands plugins."""
    cur = await conn.execute("SELECT secret FROM service_secrets WHERE name = 'upload_hmac'")
    return bytes((await cur.fetchone())[0])
