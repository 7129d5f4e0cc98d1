"""GET /v0/health: the readiness probe (no key)."""

from __future__ import annotations

from litestar import Request, Response, get

from contentsvc.api.http import respond, services
from contentsvc.domain.models import Health
from contentsvc.domain.errors import storage_unavailable


@get("/v0/health", operation_id="getHealth")
async def health(request: Request) -> Response:
    try:
        async with services(request).pool.connection(timeout=2.0) as conn:
            await conn.execute("SELECT 1")
    except Exception:
        raise storage_unavailable() from None
    return respond(Health(status="ok"))


ROUTES = [health]
