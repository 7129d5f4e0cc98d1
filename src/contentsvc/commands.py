"""Command handlers: validate, claim idempotency, append events, one transaction.

Each handler writes the journal events of its command and, through the
read-model fold, the rows that must be readable the instant the answer
leaves (the pending Receipt, the new Corpus). Nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc import idempotency
from contentsvc.auth.principal import Principal
from contentsvc.domain.canonical import request_digest
from contentsvc.domain import uploads as up
from contentsvc.domain.ingest import (
    blob_references,
    check_ingest,
    ingest_accepted,
    unverified_blob,
    withdrawal_accepted,
)
from contentsvc.domain.models import ActionRequest, CorpusRequest, IngestCommand, UploadRequest, WithdrawalCommand
from contentsvc.domain.retrieval import effective_retrieval
from contentsvc.errors import ApiError, not_found
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.readviews import existing_corpora
from contentsvc.search.vector_index import SPACE, engine_vectors_enabled
from projectors.readmodel import fold


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class Accepted:
    receipt_id: str
    replayed: bool


SourceCommand = IngestCommand | WithdrawalCommand


async def accept_source_commands(
    conn: AsyncConnection, p: Principal, commands: list[SourceCommand | ApiError], family: str
) -> list[Accepted | ApiError]:
    """Accept ingest (or withdrawal) commands in one transaction.

    Entries that are already errors pass through; each other entry is
    checked on its own and becomes an Accepted receipt or an ApiError.
    """
    results: list[Accepted | ApiError | None] = [c if isinstance(c, ApiError) else None for c in commands]
    live = [(i, c) for i, c in enumerate(commands) if not isinstance(c, ApiError)]
    for i, cmd in live:
        try:
            p.require_corpus(cmd.source.corpus_id)
            if isinstance(cmd, IngestCommand):
                check_ingest(cmd)
        except ApiError as exc:
            results[i] = exc
    live = [(i, c) for i, c in live if results[i] is None]
    if not live:
        return results  # type: ignore[return-value]

    async with journal_transaction(conn):
        known = await existing_corpora(conn, p.org_id, sorted({c.source.corpus_id for _, c in live}))
        for i, cmd in live:
            if cmd.source.corpus_id not in known:
                results[i] = not_found("corpus")
        live = [(i, c) for i, c in live if results[i] is None]

        # Every referenced Blob must be a verified Blob of the caller's Organization (part 1 rule 7).
        references = {i: blob_references(c) for i, c in live if isinstance(c, IngestCommand)}
        wanted = sorted({b.blob_id for refs in references.values() for _, b in refs})
        verified = await verified_blobs(conn, p.org_id, wanted) if wanted else {}
        for i, refs in references.items():
            missing = next((pointer for pointer, b in refs if b.blob_id not in verified), None)
            if missing is not None:
                results[i] = unverified_blob(f"{missing}/blob_id")
        live = [(i, c) for i, c in live if results[i] is None]

        # Two entries of one request with the same key: the later replays or conflicts.
        first_by_key: dict[str, tuple[int, bytes]] = {}
        claims: list[idempotency.Claim] = []
        planned: dict[int, str] = {}
        same_request_later: list[tuple[int, int]] = []
        for i, cmd in live:
            digest = request_digest(cmd)
            if cmd.idempotency_key in first_by_key:
                j, first_digest = first_by_key[cmd.idempotency_key]
                if first_digest == digest:
                    same_request_later.append((i, j))
                else:
                    results[i] = idempotency.conflict()
                continue
            first_by_key[cmd.idempotency_key] = (i, digest)
            receipt_id = new_id("rcp")
            planned[i] = receipt_id
            claims.append(idempotency.Claim(cmd.idempotency_key, digest, 202, "receipt", receipt_id))

        priors = await idempotency.claim(conn, p.org_id, family, claims)
        accepted_at = utc_now()
        new_events: list[NewEvent] = []
        for i, cmd in live:
            if i not in planned:
                continue
            prior = priors.get(cmd.idempotency_key)
            if isinstance(prior, ApiError):
                results[i] = prior
            elif prior is not None:
                results[i] = Accepted(prior.resource_id, replayed=True)
            else:
                receipt_id = planned[i]
                if isinstance(cmd, IngestCommand):
                    blobs = {b.blob_id: verified[b.blob_id] for _, b in references[i]}
                    new_events.append(ingest_accepted(p.org_id, cmd, receipt_id, accepted_at, blobs))
                else:
                    new_events.append(withdrawal_accepted(p.org_id, cmd, receipt_id, accepted_at))
                results[i] = Accepted(receipt_id, replayed=False)
        for i, j in same_request_later:
            first = results[j]
            results[i] = Accepted(first.receipt_id, replayed=True) if isinstance(first, Accepted) else first
        if new_events:
            await fold(conn, new_events)  # the pending Receipts, readable at once
            await append(conn, new_events)
    return results  # type: ignore[return-value]


async def create_corpus(conn: AsyncConnection, p: Principal, req: CorpusRequest) -> tuple[str, bool]:
    """Returns (corpus_id, replayed)."""
    if p.corpora is not None and (req.corpus_id is None or req.corpus_id not in p.corpora):
        raise ApiError(403, "forbidden", "The API key's Corpus scope does not include this Corpus.")
    retrieval = effective_retrieval(req.retrieval)
    corpus_id = req.corpus_id or new_id("crp").lower()
    async with journal_transaction(conn):
        prior = await idempotency.claim_one(conn, p.org_id, idempotency.CORPORA, req.idempotency_key,
                                            request_digest(req), 201, "corpus", corpus_id)
        if prior is not None:
            return prior, True
        # Serializes creators of one corpus id (different keys, same id).
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"corpus:{p.org_id}:{corpus_id}",))
        if await existing_corpora(conn, p.org_id, [corpus_id]):
            raise ApiError(409, "corpus_exists", f"Corpus {corpus_id!r} already exists.", field="/corpus_id")
        event = NewEvent(
            kind=ev.CORPUS_CREATED,
            org_id=p.org_id,
            corpus_id=corpus_id,
            subject_type="corpus",
            subject_id=corpus_id,
            payload={
                "corpus_id": corpus_id,
                "name": req.name,
                "retrieval": retrieval,
                "projection_generation_id": new_id("gen"),
                "vector_spaces": [SPACE] if engine_vectors_enabled() else [],
                "created_at": utc_now(),
            },
        )
        await fold(conn, [event])
        await append(conn, [event])
    return corpus_id, False


# ---------------------------------------------------------------- uploads


async def verified_blobs(conn: AsyncConnection, org_id: str, blob_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The verified Blobs among blob_ids, of this Organization only (possessing an id grants nothing)."""
    cur = await conn.execute(
        "SELECT blob_id, sha256, size_bytes, storage_key FROM blobs WHERE org_id = %s AND blob_id = ANY(%s)",
        (org_id, blob_ids),
    )
    return {r[0]: {"sha256": r[1], "size_bytes": r[2], "storage_key": r[3]} for r in await cur.fetchall()}


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


def _upload_event(kind: str, row_or_org: dict[str, Any] | str, upload_id: str, payload: dict[str, Any]) -> NewEvent:
    org_id = row_or_org if isinstance(row_or_org, str) else row_or_org["org_id"]
    return NewEvent(kind=kind, org_id=org_id, subject_type="upload", subject_id=upload_id,
                    payload={"upload_id": upload_id, **payload})


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
        event = _upload_event(ev.UPLOAD_CREATED, p.org_id, upload_id, {
            "blob_id": new_id("blob"),
            "media_type": req.media_type,
            "size_bytes": req.size_bytes,
            "sha256": req.sha256,
            "filename": req.filename,
            "expires_at": up.utc(expires_at),
            "created_at": up.utc(now),
        })
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
        storage_key = await store_content()
        event = _upload_event(ev.UPLOAD_RECEIVED, row, upload_id, {
            "size_bytes": size,
            "sha256": sha256,
            "storage_key": storage_key,
            "received_at": utc_now(),
        })
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
                event = _upload_event(ev.UPLOAD_FAILED, row, upload_id,
                                      {"error": up.EXPIRED_ERROR, "failed_at": utc_now()})
        elif row["state"] == "verifying":
            error = up.verdict(row["size_bytes"], row["sha256"], row["received_size"], row["received_sha256"])
            if error is None and row["storage_key"] is None:  # cannot happen: matching bytes are always stored
                error = {"code": "checksum_mismatch", "retryable": False, "message": "The bytes were not stored."}
            if error is None:
                event = _upload_event(ev.UPLOAD_VERIFIED, row, upload_id, {
                    "blob_id": row["blob_id"],
                    "media_type": row["media_type"],
                    "size_bytes": row["received_size"],
                    "sha256": row["received_sha256"],
                    "storage_key": row["storage_key"],
                    "verified_at": utc_now(),
                })
            else:
                event = _upload_event(ev.UPLOAD_FAILED, row, upload_id, {"error": error, "failed_at": utc_now()})
        if event is not None:
            await fold(conn, [event])
            await append(conn, [event])
