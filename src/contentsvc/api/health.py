"""GET /v0/health: the readiness probe (no key)."""

from __future__ import annotations

from litestar import Response

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.domain.models import Health
from contentsvc.domain.errors import storage_unavailable


@operation("getHealth", "GET", "/v0/health", permission=None, responses={200: Health})
async def health(call: Call[None, None]) -> Response:
    try:
        async with services(call.request).pool.connection(timeout=2.0) as conn:
            await conn.execute("SELECT 1")
    except Exception:
        raise storage_unavailable() from None
    return respond(Health(status="ok"))


ROUTES = [health]
