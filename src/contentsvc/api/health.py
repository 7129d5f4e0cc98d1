"""GET /v0/health: the readiness probe (no key)."""

from __future__ import annotations

from litestar import Response

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.domain.models import Health
from contentsvc.domain.errors import storage_unavailable


# Within 2 s in all (docs/decisions.md "A slow or dead database"): at once while the watch
# sees the database away, else a pooled connection and its SELECT 1 within this, plus the
# 0.5 s an abandoned query is given to cancel: 1.5 s, leaving the client's own round trip room.
HEALTH_ANSWER_SECONDS = 1.0


@operation("getHealth", "GET", "/v0/health", permission=None, responses={200: Health})
async def health(call: Call[None, None]) -> Response:
    svc = services(call.request)
    try:
        async with svc.pool.connection(timeout=HEALTH_ANSWER_SECONDS, within=HEALTH_ANSWER_SECONDS) as conn:
            await conn.execute("SELECT 1")
    except Exception:
        raise storage_unavailable(svc.settings.database.retry_after_seconds) from None
    return respond(Health(status="ok"))


ROUTES = [health]
