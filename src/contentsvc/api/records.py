"""Routes of the Record family: ingest, batch, withdraw, read, list (part 1 rules 1-6)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Request, Response
from msgspec import Meta

from contentsvc.api.http import page_after, respond, services
from contentsvc.api.routes import Call, Query, operation
from contentsvc.commands import records as commands
from contentsvc.config import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ENTRIES,
    MAX_INGEST_BYTES,
    RECORD_PAGE_DEFAULT,
    RECORD_PAGE_MAX,
)
from contentsvc.domain.cursors import resync_url
from contentsvc.domain.decoding import decode_body
from contentsvc.domain.errors import ApiError, not_found
from contentsvc.domain.models import (
    BatchItem,
    BatchRequest,
    BatchResult,
    Error,
    IngestCommand,
    NonEmpty,
    Receipt,
    Record,
    RecordPage,
    Version,
    WithdrawalCommand,
)
from contentsvc.readmodel.corpora import existing_corpora
from contentsvc.readmodel.receipts import answer_receipts
from contentsvc.readmodel.records import list_records, load_record, load_version

RECORD_CURSOR = "records"


def receipt_location(receipt_id: str) -> dict[str, str]:
    return {"Location": f"/v0/ingestion-receipts/{receipt_id}"}


async def _receipts_for(request: Request, p, accepted: list, commands_: list) -> dict:
    """Receipts to answer with: fresh ones are pending; replays are reread."""
    return await answer_receipts(services(request).pool, p, [
        (a, cmd) for a, cmd in zip(accepted, commands_) if isinstance(a, commands.Accepted)])


async def _accept_one(request: Request, p, cmd) -> Response:
    await services(request).backlog.refuse_when_behind()
    result = await services(request).single_commands.accept(p, cmd)  # group commit
    if isinstance(result, ApiError):
        raise result
    receipt = (await _receipts_for(request, p, [result], [cmd]))[result.receipt_id]
    return respond(receipt, 202, receipt_location(result.receipt_id))


@operation("ingestRecord", "POST", "/v0/records", permission=("content:write",), body=IngestCommand,
           responses={202: Receipt})
async def ingest_record(call: Call[IngestCommand, None]) -> Response:
    return await _accept_one(call.request, call.principal, call.body)


@operation("withdrawRecord", "POST", "/v0/records/withdrawals", permission=("content:write",),
           body=WithdrawalCommand, responses={202: Receipt})
async def withdraw_record(call: Call[WithdrawalCommand, None]) -> Response:
    return await _accept_one(call.request, call.principal, call.body)


def _entry(raw: msgspec.Raw, index: int) -> IngestCommand | ApiError:
    """One batch entry, validated on its own (part 1 rule 2)."""
    if len(raw) > MAX_INGEST_BYTES:
        return ApiError(413, "entry_too_large", f"Entry {index} exceeds {MAX_INGEST_BYTES} bytes.",
                        field=f"/entries/{index}")
    try:
        return decode_body(bytes(raw), IngestCommand, depth_checked=True)  # bounded with the batch
    except ApiError as exc:
        if exc.code == "malformed_json":  # an entry that is not an object
            return ApiError(422, "invalid_schema", "A batch entry must be an object.", field=f"/entries/{index}")
        if exc.field is not None:
            exc.field = f"/entries/{index}{exc.field}"
        return exc


def _error(exc: ApiError) -> Error:
    return Error(code=exc.code, message=exc.message, retryable=exc.retryable, field=exc.field)


@operation("ingestBatch", "POST", "/v0/records/batch", permission=("content:write",), body=BatchRequest,
           body_limit=MAX_BATCH_BYTES, responses={200: BatchResult},
           # Entries are decoded one by one, each fault answered in its item (rule 2).
           body_members={"entries": {"items": IngestCommand, "maxItems": MAX_BATCH_ENTRIES}})
async def ingest_batch(call: Call[BatchRequest, None]) -> Response:
    request, p, batch = call.request, call.principal, call.body
    if len(batch.entries) > MAX_BATCH_ENTRIES:
        raise ApiError(413, "batch_too_large", f"A batch holds at most {MAX_BATCH_ENTRIES} entries.",
                       field="/entries")
    await services(request).backlog.refuse_when_behind()
    entries = [_entry(r, i) for i, r in enumerate(batch.entries)]
    async with services(request).pool.connection() as conn:
        results = await commands.accept_source_commands(conn, p, entries)
    receipts = await _receipts_for(request, p, results, entries)
    items = []
    for i, result in enumerate(results):
        if isinstance(result, ApiError):
            if result.field is None or not result.field.startswith("/entries/"):
                result.field = f"/entries/{i}{result.field or ''}"
            items.append(BatchItem(index=i, status=result.status, error=_error(result)))
        else:
            items.append(BatchItem(index=i, status=202, receipt=receipts[result.receipt_id]))
    return respond(BatchResult(items=items), 200)


@operation("getRecord", "GET", "/v0/records/{record_id}", permission=("content:read",), responses={200: Record})
async def get_record(call: Call[None, None], record_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        record = await load_record(conn, call.principal, record_id)
    if record is None:
        raise not_found("record")
    return respond(record)


@operation("getVersion", "GET", "/v0/records/{record_id}/versions/{version_id}", permission=("content:read",),
           responses={200: Version})
async def get_version(call: Call[None, None], record_id: str, version_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        version = await load_version(conn, call.principal, record_id, version_id)
    if version is None:
        raise not_found("version")
    return respond(version)


class RecordListQuery(Query, kw_only=True):
    corpus_id: NonEmpty
    page_cursor: NonEmpty | None = None
    limit: Annotated[int, Meta(ge=1, le=RECORD_PAGE_MAX)] = RECORD_PAGE_DEFAULT


@operation("listRecords", "GET", "/v0/records", permission=("content:read",), query=RecordListQuery,
           responses={200: RecordPage})
async def list_records_route(call: Call[None, RecordListQuery]) -> Response:
    request, p, corpus_id, limit = call.request, call.principal, call.query.corpus_id, call.query.limit
    p.require_corpus(corpus_id)
    svc = services(request)
    binding = {"org": p.org_id, "corpus": corpus_id, "scope": p.scope_digest()}
    after = page_after(request, call.query.page_cursor, RECORD_CURSOR, binding, resync_url(corpus_id))
    async with svc.pool.connection() as conn:
        if after is None and not await _corpus_exists(conn, p.org_id, corpus_id):
            raise not_found("corpus")
        items = await list_records(conn, p, corpus_id, after, limit + 1)  # one more: do more remain?
    more, items = len(items) > limit, items[:limit]
    page = RecordPage(items=items)
    if more:  # Conventions: next_page_cursor only when more remain
        page.next_page_cursor = svc.cursors.encode(RECORD_CURSOR, after=items[-1].record_id, **binding)
    return respond(page)


async def _corpus_exists(conn, org_id: str, corpus_id: str) -> bool:
    return bool(await existing_corpora(conn, org_id, [corpus_id]))


ROUTES = [ingest_record, withdraw_record, ingest_batch, get_record, get_version, list_records_route]
