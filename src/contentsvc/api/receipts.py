"""getReceipt (part 1 rule 5)."""

from __future__ import annotations

from litestar import Response

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.domain.models import Receipt
from contentsvc.domain.errors import not_found
from contentsvc.readmodel.receipts import load_receipt


@operation("getReceipt", "GET", "/v0/ingestion-receipts/{receipt_id}", permission=("content:read",),
           responses={200: Receipt})
async def get_receipt(call: Call[None, None], receipt_id: str) -> Response:
    async with services(call.request).pool.connection() as conn:
        receipt = await load_receipt(conn, call.principal, receipt_id)
    if receipt is None:
        raise not_found("receipt")
    return respond(receipt)


ROUTES = [get_receipt]
