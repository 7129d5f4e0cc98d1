"""Routes of the Upload and Blob family (part 1 rules 7, 8; decisions.md "Uploads and Blobs").

createUpload issues a session with one presigned PUT URL served by this
API (no API key on it: the URL's HMAC signature and expiry authorize it).
The PUT streams its body into the blob store, hashing and counting on the
way, and records what arrived; confirmUpload compares that with what the
session declared and moves it to `verified` (a Blob exists) or `failed`
(`size_mismatch`, `checksum_mismatch`, `upload_expired`).
"""

from __future__ import annotations

import asyncio
import errno
import shutil
import time
from typing import Annotated

from litestar import Request, Response
from litestar.exceptions import InternalServerException
from msgspec import Meta

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, Query, Stream, operation
from contentsvc.commands import uploads as commands
from contentsvc.domain import uploads as up
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError, not_found, storage_unavailable
from contentsvc.domain.models import (
    ActionRequest,
    Blob,
    Error,
    NonEmpty,
    Upload,
    UploadRequest,
)
from contentsvc.logging import get_logger
from contentsvc.readmodel.uploads import load_upload, read_upload_secret
from contentsvc.storage.blobstore import BlobStore, FilesystemBlobStore, PipelinedWriter

log = get_logger("contentsvc.api.uploads")


async def upload_secret(request: Request) -> bytes:
    """The presigned URLs' HMAC key (service_secrets `upload_hmac`), read once per process."""
    state = request.app.state
    secret = state.get("upload_hmac")
    if secret is None:
        async with services(request).pool.connection() as conn:
            secret = await read_upload_secret(conn)
        state["upload_hmac"] = secret
    return secret


def blob_store(request: Request) -> BlobStore:
    state = request.app.state
    store = state.get("blob_store")
    if store is None:
        store = state["blob_store"] = FilesystemBlobStore(services(request).settings.blob_root)
        swept = store.sweep_incoming()
        if swept:
            log.info("blob_store_swept", partial_uploads_removed=swept)
    return store


def upload_view(request: Request, row: dict, secret: bytes) -> Upload:
    upload_id = row["upload_id"]
    # The configured public base URL, never the request's Host header: a forged Host must not
    # send the client's bytes elsewhere.
    base = services(request).public_base_url
    return Upload(
        upload_id=upload_id,
        state=row["state"],
        put_url=up.put_url(base, secret, upload_id, row["expires_at"]),
        put_headers=up.put_headers(row["media_type"], row["size_bytes"], row["sha256"]),
        expires_at=iso(row["expires_at"]),
        media_type=row["media_type"],
        size_bytes=row["size_bytes"],
        sha256=row["sha256"],
        blob_id=row["blob_id"],
        error=Error(**row["error"]) if row["error"] else None,
    )


def _location(upload_id: str) -> dict[str, str]:
    return {"Location": f"/v0/uploads/{upload_id}"}


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


@operation("createUpload", "POST", "/v0/uploads", permission=("blobs:write",), body=UploadRequest,
           body_members=lambda settings: {"size_bytes": {"maximum": settings.max_blob_bytes}},
           responses={201: Upload, 200: Upload})
async def create_upload(call: Call[UploadRequest, None]) -> Response:
    request, p, req = call.request, call.principal, call.body
    settings = services(request).settings
    if req.size_bytes > settings.max_blob_bytes:  # before any session is issued (rule 7)
        raise ApiError(413, "request_too_large",
                       f"size_bytes {req.size_bytes} exceeds the Blob limit of {settings.max_blob_bytes} bytes "
                       f"({_mib(settings.max_blob_bytes)}).", field="/size_bytes")
    async with services(request).pool.connection() as conn:
        upload_id, replayed = await commands.create_upload(conn, p, req, settings.upload_url_ttl_seconds)
        row = await load_upload(conn, upload_id, p.org_id)
    return respond(upload_view(request, row, await upload_secret(request)), 200 if replayed else 201,
                   _location(upload_id))


def invalid_signature() -> ApiError:
    return ApiError(403, "invalid_signature", "The upload URL's signature is missing or does not match; use the "
                    "put_url of the Upload unchanged.")


class PresignedQuery(Query, kw_only=True):
    """The query of a put_url: its expiry (Unix seconds) and HMAC signature."""

    expires: Annotated[int, Meta(ge=0)]
    signature: NonEmpty


# Sent with the Upload's put_headers; the body is bounded by the session's declared size,
# itself under the Blob limit.
UPLOAD_BYTES = Stream("*/*", "The Upload's bytes, exactly size_bytes of media_type, with its put_headers.")


@operation("putUploadContent", "PUT", "/v0/uploads/{upload_id}/content", permission=None, query=PresignedQuery,
           query_refusal=invalid_signature, body=UPLOAD_BYTES, headers=((up.SHA256_HEADER, True),),
           responses={200: Upload})
async def put_upload_content(call: Call[None, PresignedQuery], upload_id: str) -> Response:
    request, expires = call.request, call.query.expires
    secret = await upload_secret(request)
    if not up.signature_valid(secret, upload_id, expires, call.query.signature):
        raise invalid_signature()
    if time.time() >= expires:
        raise ApiError(410, "upload_expired", "The upload URL has expired; create a new upload.")
    svc = services(request)
    async with svc.pool.connection() as conn:
        row = await load_upload(conn, upload_id)
    if row is None:
        raise not_found("upload")
    request.scope.setdefault("state", {})["org_id"] = row["org_id"]
    if row["step"] > 0:
        raise commands.already_received(row["state"])
    up.check_put_headers(request.headers, row["media_type"], row["size_bytes"], row["sha256"])

    try:
        row = await _store_body(request, upload_id, row)
    except OSError as exc:
        if isinstance(exc, ConnectionError):
            raise
        raise _blob_store_unwritable(request, upload_id, exc) from None
    return respond(upload_view(request, row, secret), 200, _location(upload_id))


async def _store_body(request: Request, upload_id: str, row: dict) -> dict:
    """The PUT's body into the blob store, hashed on the way, and what arrived recorded on the
    Upload; its row afterwards. Raises the blob store's OSError (a full or failing disk)."""
    declared = row["size_bytes"]
    svc = services(request)
    writer = await asyncio.to_thread(blob_store(request).writer)
    pipe = PipelinedWriter(writer)
    try:
        received = 0
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > declared:  # HTTP framing prevents it; never store more than declared
                    raise ApiError(413, "request_too_large", f"The body exceeds Content-Length {declared}.")
                await pipe.write(chunk)
        except InternalServerException:
            # The client went away before sending Content-Length bytes: what arrived is
            # recorded, so the session fails verification with size_mismatch.
            log.info("upload_truncated", upload_id=upload_id, received=received, declared=declared)
        await pipe.close()
        size, sha256 = writer.size, writer.hexdigest()

        matches = size == declared and sha256 == row["sha256"]
        if matches:
            # Durable before the row lock is taken: a large Blob's fsync is not a wait on the
            # database, and must not count against its answer bound (database.unresponsive_seconds).
            await asyncio.to_thread(writer.finish)

        async def store_content() -> str | None:
            if matches:
                return await asyncio.to_thread(writer.commit)
            return None  # not the declared bytes: nothing to keep

        async with svc.pool.connection() as conn:
            await commands.receive_upload(conn, upload_id, size, sha256, store_content)
            row = await load_upload(conn, upload_id)
    finally:
        await pipe.abort()  # drops the temporary file; a no-op after commit
    return row


def _blob_store_unwritable(request: Request, upload_id: str, exc: OSError) -> ApiError:
    """A disk the blob store cannot write (full, over quota, read-only, failing) is a dependency
    that is unavailable, not a fault of the request: 503 storage_unavailable, retryable. Nothing
    of the body is kept (the temporary file is dropped) and the Upload still awaits its bytes, so
    the same PUT succeeds once there is room. The operator's log line names the cause."""
    svc = services(request)
    root = svc.settings.blob_root
    try:
        free_bytes = shutil.disk_usage(root).free
    except OSError:
        free_bytes = None
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    log.warning("blob_store_unwritable", upload_id=upload_id, error=errno.errorcode.get(exc.errno, type(exc).__name__),
                reason=exc.strerror, blob_root=str(root), free_bytes=free_bytes)
    return storage_unavailable(svc.settings.database.retry_after_seconds,
                               "The blob store has no space left" if full else "The blob store cannot be written")


@operation("confirmUpload", "POST", "/v0/uploads/{upload_id}/confirm", permission=("blobs:write",),
           body=ActionRequest, body_required=False,  # an empty body is accepted
           responses={202: Upload})
async def confirm_upload(call: Call[ActionRequest | None, None], upload_id: str) -> Response:
    request, p, req = call.request, call.principal, call.body
    async with services(request).pool.connection() as conn:
        await commands.confirm_upload(conn, p, upload_id, req)
        row = await load_upload(conn, upload_id, p.org_id)
    return respond(upload_view(request, row, await upload_secret(request)), 202, _location(upload_id))


@operation("getUpload", "GET", "/v0/uploads/{upload_id}", permission=("blobs:read",), responses={200: Upload})
async def get_upload(call: Call[None, None], upload_id: str) -> Response:
    request = call.request
    async with services(request).pool.connection() as conn:
        row = await load_upload(conn, upload_id, call.principal.org_id)
    if row is None:
        raise not_found("upload")
    return respond(upload_view(request, row, await upload_secret(request)))


@operation("getBlob", "GET", "/v0/blobs/{blob_id}", permission=("blobs:read",), responses={200: Blob})
async def get_blob(call: Call[None, None], blob_id: str) -> Response:
    p = call.principal
    async with services(call.request).pool.connection() as conn:
        cur = await conn.execute(
            "SELECT blob_id, media_type, size_bytes, sha256, created_at FROM blobs WHERE blob_id = %s AND org_id = %s"
            " AND collected_at IS NULL",
            (blob_id, p.org_id),
        )
        row = await cur.fetchone()
    if row is None:  # unknown, not verified, collected, or another Organization's: an id grants nothing
        raise not_found("blob")
    return respond(Blob(blob_id=row[0], media_type=row[1], size_bytes=row[2], sha256=row[3], created_at=iso(row[4])))


ROUTES = [create_upload, put_upload_content, confirm_upload, get_upload, get_blob]
