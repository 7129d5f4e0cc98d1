"""Upload commands: create a session, receive the presigned PUT, confirm (part 1 rules 7, 8)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Awaitable, Callable

from psycopg import AsyncConnection

from contentsvc.auth.principal import Principal
from contentsvc.commands import idempotency
from contentsvc.domain import uploads as up
from contentsvc.domain.canonical import request_digest
from contentsvc.domain.clock import utc_now
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.domain.models import ActionRequest, UploadRequest
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.readmodel.fold import fold
from contentsvc.readmodel.uploads import hold_storage_key, load_upload
from contentsvc.storage.blobstore import key_for


def _upload_event(org_id: str, payload: ev.UploadCreated | ev.UploadReceived | ev.UploadVerified | ev.UploadFailed
                  ) -> NewEvent:
    return NewEvent(org_id=org_id, subject_type="upload", subject_id=payload.upload_id, payload=payload)


async def create_upload(conn: AsyncConnection, p: Principal, req: UploadRequest, ttl_seconds: int) -> tuple[str, bool]:
    """createUpload: returns (upload_id, replayed). The size limit is checked before (no session)."""
    upload_id = new_id("upl")
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, idempotency.UPLOADS, req.idempotency_key,
                                            request_digest(req), 201, "upload", upload_id)
        if prior is not None:
            return prior, True
        now = datetime.now(timezone.utc)
        expires_at = now.replace(microsecond=0) + timedelta(seconds=ttl_seconds)  # the URL carries whole seconds
        event = _upload_event(p.org_id, ev.UploadCreated(
            upload_id=upload_id,
            blob_id=new_id("blob"),
            media_type=req.media_type,
            size_bytes=req.size_bytes,
            sha256=req.sha256,
            filename=req.filename,
            expires_at=up.utc(expires_at),
            created_at=up.utc(now),
        ))
        await fold(conn, [event])  # readable (and PUT-able) the instant the 201 leaves
        await append(conn, [event])
    return upload_id, False


async def receive_upload(conn: AsyncConnection, upload_id: str, size: int, sha256: str,
                         store_content: Callable[[], Awaitable[str | None]]) -> None:
    """The presigned PUT's bytes were streamed and hashed: record what arrived.

    store_content places the bytes in the blob store (returns the key, or
    None when they are not the declared bytes and were dropped); it runs
    only when this PUT is the session's first, under the row lock.
    """
    async with journal_transaction(conn):
        row = await load_upload(conn, upload_id, for_update=True)
        if row is None:
            raise not_found("upload")
        if row["step"] > 0:
            raise already_received(row["state"])
        # Content-addressed: the file may already be there, about to be collected.
        await hold_storage_key(conn, key_for(sha256))
        storage_key = await store_content()
        event = _upload_event(row["org_id"], ev.UploadReceived(
            upload_id=upload_id,
            size_bytes=size,
            sha256=sha256,
            storage_key=storage_key,
            received_at=utc_now(),
        ))
        await fold(conn, [event])
        await append(conn, [event])


def already_received(state: str) -> ApiError:
    return ApiError(409, "upload_already_received",
                    f"This upload already received its bytes (state {state}); a session takes one PUT.")


async def confirm_upload(conn: AsyncConnection, p: Principal, upload_id: str, req: ActionRequest | None) -> None:
    """confirmUpload: starts or observes verification; repeatable (part 1 rule 7)."""
    async with journal_transaction(conn):
        if req is not None and req.idempotency_key is not None:
            await idempotency.claim_one(conn, p.org_id, idempotency.UPLOAD_CONFIRM, req.idempotency_key,
                                        request_digest(req, upload_id=upload_id), 202, "upload", upload_id)
        row = await load_upload(conn, upload_id, p.org_id, for_update=True)
        if row is None:
            raise not_found("upload")
        event = None
        if row["state"] == "awaiting_upload":
            if datetime.now(timezone.utc) >= row["expires_at"]:
                event = _upload_event(row["org_id"], ev.UploadFailed(upload_id=upload_id, error=up.EXPIRED_ERROR,
                                                                     failed_at=utc_now()))
        elif row["state"] == "verifying":
            error = up.verdict(row["size_bytes"], row["sha256"], row["received_size"], row["received_sha256"])
            if error is None and row["storage_key"] is None:  # cannot happen: matching bytes are always stored
                error = {"code": "checksum_mismatch", "retryable": False, "message": "The bytes were not stored."}
            if error is None:
                event = _upload_event(row["org_id"], ev.UploadVerified(
                    upload_id=upload_id,
                    blob_id=row["blob_id"],
                    media_type=row["media_type"],
                    size_bytes=row["received_size"],
                    sha256=row["received_sha256"],
                    storage_key=row["storage_key"],
                    verified_at=utc_now(),
                ))
            else:
                event = _upload_event(row["org_id"], ev.UploadFailed(upload_id=upload_id, error=error,
                                                                     failed_at=utc_now()))
        if event is not None:
            await fold(conn, [event])
            await append(conn, [event])
