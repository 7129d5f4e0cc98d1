"""getReceipt (part 1 rule 5)."""

from __future__ import annotations

from litestar import Request, Response, get

from contentsvc.api.http import authenticate, respond, services
from contentsvc.domain.errors import not_found
from contentsvc.readmodel.records import load_receipt


@get("/v0/ingestion-receipts/{receipt_id:str}", operation_id="getReceipt")
async def get_receipt(request: Request, receipt_id: str) -> Response:
    p = await authenticate(request, "content:read")
    async with services(request).pool.connection() as conn:
        receipt = await load_receipt(conn, p, receipt_id)
    if receipt is None:
        raise not_found("receipt")
    return respond(receipt)


ROUTES = [get_receipt]
