"""GET /v0/health: the readiness probe (no key)."""

from __future__ import annotations

from litestar import Response

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.domain.models import Health
from contentsvc.domain.errors import storage_unavailable
from contentsvc.storage.database import PoolBusy


# Within 2 s in all (docs/decisions.md "A slow or dead database"): at once while the watch
# sees the database away, else a pooled connection and its SELECT 1 within this, plus the
# 0.5 s an abandoned query is given to cancel: 1.5 s, leaving the client's own round trip room.
HEALTH_ANSWER_SECONDS = 1.0
# The wait for a pooled connection ends first, so that a pool busy with requests is told apart
# from a database that gives no answer (PoolBusy below).
HEALTH_POOL_WAIT_SECONDS = 0.8


@operation("getHealth", "GET", "/v0/health", permission=None, responses={200: Health})
async def health(call: Call[None, None]) -> Response:
    svc = services(call.request)
    try:
        async with svc.pool.connection(timeout=HEALTH_POOL_WAIT_SECONDS, within=HEALTH_ANSWER_SECONDS) as conn:
            await conn.execute("SELECT 1")
    except PoolBusy:
        # Every pooled connection is lent to a request while the watch's own connection sees
        # PostgreSQL answer (within the last second): the process is busy, the database answers,
        # and 200 is "PostgreSQL answers" (decisions.md). Failing readiness for load would take a
        # busy instance out of service and push its load onto the others.
        pass
    except Exception:
        raise storage_unavailable(svc.settings.database.retry_after_seconds) from None
    return respond(Health(status="ok"))


ROUTES = [health]
