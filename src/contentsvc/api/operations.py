"""Routes of the Operation family: get, cancel, rerun, resume (part 1 rules 9 to 12),
and the two that start Operations on a Corpus: configureRetrieval (rule 15) and
rebuildCorpusProjection (rule 17)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response

from contentsvc.commands import operations as commands
from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.auth.principal import Principal
from contentsvc.domain import operations as ops
from contentsvc.domain.models import ActionRequest, ConfigUpdate, KeyedActionRequest, Operation


def _location(operation_id: str) -> dict[str, str]:
    return {"Location": f"/v0/operations/{operation_id}"}


async def _answer(request: Request, p: Principal, operation_id: str, status: int) -> Response:
    async with services(request).pool.connection() as conn:
        _, doc, _ = await commands.find_operation(conn, p, operation_id)
    return respond(msgspec.convert(doc, Operation), status, _location(operation_id))


async def _start(call: Call, command, target: str) -> Response:
    """A command that creates an Operation (or replays it): 202 with the Operation and its Location."""
    async with services(call.request).pool.connection() as conn:
        operation_id, _ = await command(conn, call.principal, target, call.body)
    return await _answer(call.request, call.principal, operation_id, 202)


@operation("getOperation", "GET", "/v0/operations/{operation_id}", permission=("operations:read",),
           responses={200: Operation})
async def get_operation(call: Call[None, None], operation_id: str) -> Response:
    return await _answer(call.request, call.principal, operation_id, 200)


@operation("cancelOperation", "POST", "/v0/operations/{operation_id}/cancel", permission=("operations:write",),
           body=ActionRequest, body_required=False, responses={200: Operation})
async def cancel_operation(call: Call[ActionRequest | None, None], operation_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        await commands.cancel_operation(conn, call.principal, operation_id, call.body)
    return await _answer(call.request, call.principal, operation_id, 200)


@operation("rerunOperation", "POST", "/v0/operations/{operation_id}/rerun", permission=("operations:write",),
           body=KeyedActionRequest, responses={202: Operation})
async def rerun_operation(call: Call[KeyedActionRequest, None], operation_id: str) -> Response:
    return await _start(call, commands.rerun_operation, operation_id)


@operation("resumeOperation", "POST", "/v0/operations/{operation_id}/resume", permission=("operations:write",),
           body=ActionRequest, body_required=False, responses={200: Operation})
async def resume_operation(call: Call[ActionRequest | None, None], operation_id: str) -> Response:
    """Only a paused backfill resumes; this deployment runs no backfills, so every
    Operation is returned as it is (rule 12)."""
    return await _answer(call.request, call.principal, operation_id, 200)


@operation("configureRetrieval", "PUT", "/v0/corpora/{corpus_id}/retrieval",
           permission=ops.STARTED_WITH[ops.RETRIEVAL_CONFIGURATION], body=ConfigUpdate, responses={202: Operation})
async def configure_retrieval(call: Call[ConfigUpdate, None], corpus_id: str) -> Response:
    return await _start(call, commands.configure_retrieval, corpus_id)


@operation("rebuildCorpusProjection", "POST", "/v0/corpora/{corpus_id}/rebuilds",
           permission=ops.STARTED_WITH[ops.PROJECTION_REBUILD], body=KeyedActionRequest, responses={202: Operation})
async def rebuild_corpus(call: Call[KeyedActionRequest, None], corpus_id: str) -> Response:
    return await _start(call, commands.rebuild_corpus, corpus_id)


ROUTES = [get_operation, cancel_operation, rerun_operation, resume_operation, configure_retrieval, rebuild_corpus]
