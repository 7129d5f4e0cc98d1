"""Routes of the Operation family: get, cancel, rerun, resume (part 1 rules 9 to 12),
and the two that start Operations on a Corpus: configureRetrieval (rule 15) and
rebuildCorpusProjection (rule 17)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get, post, put

from contentsvc.commands import operations as commands
from contentsvc.api.http import authenticate, read_body, read_json, respond, services
from contentsvc.auth.principal import Principal
from contentsvc.config import MAX_INGEST_BYTES
from contentsvc.domain.decoding import decode_body
from contentsvc.domain.models import ActionRequest, ConfigUpdate, KeyedActionRequest, Operation


def _location(operation_id: str) -> dict[str, str]:
    return {"Location": f"/v0/operations/{operation_id}"}


async def _answer(request: Request, p: Principal, operation_id: str, status: int) -> Response:
    async with services(request).pool.connection() as conn:
        _, doc, _ = await commands.find_operation(conn, p, operation_id)
    return respond(msgspec.convert(doc, Operation), status, _location(operation_id))


async def _start(request: Request, p: Principal, body: type, command, target: str) -> Response:
    """A command that creates an Operation (or replays it): 202 with the Operation and its Location."""
    req = await read_json(request, body, MAX_INGEST_BYTES)
    async with services(request).pool.connection() as conn:
        operation_id, _ = await command(conn, p, target, req)
    return await _answer(request, p, operation_id, 202)


@get("/v0/operations/{operation_id:str}", operation_id="getOperation")
async def get_operation(request: Request, operation_id: str) -> Response:
    p = await authenticate(request, "operations:read")
    return await _answer(request, p, operation_id, 200)


@post("/v0/operations/{operation_id:str}/cancel", operation_id="cancelOperation", status_code=200)
async def cancel_operation(request: Request, operation_id: str) -> Response:
    p = await authenticate(request, "operations:write")
    raw = await read_body(request, MAX_INGEST_BYTES)
    req = decode_body(raw, ActionRequest) if raw.strip() else None
    async with services(request).pool.connection() as conn:
        await commands.cancel_operation(conn, p, operation_id, req)
    return await _answer(request, p, operation_id, 200)


@post("/v0/operations/{operation_id:str}/rerun", operation_id="rerunOperation", status_code=202)
async def rerun_operation(request: Request, operation_id: str) -> Response:
    p = await authenticate(request, "operations:write")
    return await _start(request, p, KeyedActionRequest, commands.rerun_operation, operation_id)


@post("/v0/operations/{operation_id:str}/resume", operation_id="resumeOperation", status_code=200)
async def resume_operation(request: Request, operation_id: str) -> Response:
    """Only a paused backfill resumes; this deployment runs no backfills, so every
    Operation is returned as it is (rule 12)."""
    p = await authenticate(request, "operations:write")
    raw = await read_body(request, MAX_INGEST_BYTES)
    if raw.strip():
        decode_body(raw, ActionRequest)
    return await _answer(request, p, operation_id, 200)


@put("/v0/corpora/{corpus_id:str}/retrieval", operation_id="configureRetrieval", status_code=202)
async def configure_retrieval(request: Request, corpus_id: str) -> Response:
    p = await authenticate(request, "corpora:write", "operations:write")
    return await _start(request, p, ConfigUpdate, commands.configure_retrieval, corpus_id)


@post("/v0/corpora/{corpus_id:str}/rebuilds", operation_id="rebuildCorpusProjection", status_code=202)
async def rebuild_corpus(request: Request, corpus_id: str) -> Response:
    p = await authenticate(request, "projections:rebuild")
    return await _start(request, p, KeyedActionRequest, commands.rebuild_corpus, corpus_id)


ROUTES = [get_operation, cancel_operation, rerun_operation, resume_operation, configure_retrieval, rebuild_corpus]
