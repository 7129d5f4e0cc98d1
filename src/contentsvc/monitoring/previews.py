"""previewSubscription: `POST /v0/subscription-previews` (`monitoring:write`), a dry run of a
proposed Subscription (part 2 rule 11; decisions-part2 "Monitoring" > "Preview").

- The Saved Query Version is any one the key may read (rule 3: grants on the Corpora of the
  query's current Version and of that Version), current or not, of a deleted query too; else 422
  unknown_saved_query.
- The evaluator is validated as on create (monitoring/evaluators.py, shapes.check_against_evaluator):
  unsupported_evaluator, invalid_expression, invalid_subscription_configuration.
- Candidates: the `limit` most recently accepted Versions that are current, searchable, of a
  Record not withdrawn, in the Saved Query Version's Corpora. Each is one subscription request
  with one evaluation (`e1`), built exactly as the `monitor` worker builds them
  (monitoring/evaluation_request.py).
- Commits nothing: no Match, no Delivery, no event; no destination is named.
- The whole call is bounded by `[monitoring] preview_timeout_seconds`: past it, or with the
  evaluator unreachable or answering a retryable error, 503 evaluator_unavailable with
  Retry-After; a terminal error or invalid output is 502 evaluator_failed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Response
from msgspec import Meta
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.api.http import respond, services
from contentsvc.api.routes import Call, operation
from contentsvc.auth.principal import Principal
from contentsvc.config import Settings
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Input, NonEmpty, Output
from contentsvc.ids import new_id
from contentsvc.monitoring import views
from contentsvc.monitoring.batches import InvalidOutput, check_answer, part_keys, preview_batch, subscription_request
from contentsvc.monitoring.evaluation_request import RecordVersion, record_object
from contentsvc.monitoring.evaluators import installed_evaluator
from contentsvc.monitoring.shapes import EvaluatorPin, IdempotencyKey, check_against_evaluator
from contentsvc.plugins.client import ROUTE_CLIENTS, PluginClient, PluginFailed, PluginUnreachable
from contentsvc.plugins.plans import Provider, load_provider

WRITE = ("monitoring:write",)
LIMIT_MAX = 100
LIMIT_DEFAULT = 20
RETRY_AFTER_SECONDS = 5  # as part 2's other plugin_unavailable answers


class PreviewRequest(Input, kw_only=True):
    saved_query_version_id: NonEmpty
    evaluator: EvaluatorPin
    limit: Annotated[int, Meta(ge=1, le=LIMIT_MAX)] = LIMIT_DEFAULT
    idempotency_key: IdempotencyKey | None = None  # decisions-part2: accepted and ignored (nothing commits)


class PreviewItem(Output, kw_only=True):
    record_id: str
    version_id: str
    corpus_id: str
    decision: str
    evidence: dict[str, Any] | None = None


class Preview(Output, kw_only=True):
    items: list[PreviewItem]
    evaluated: int
    matched: int


def evaluator_unavailable(message: str) -> ApiError:
    return ApiError(503, "evaluator_unavailable", message, retryable=True,
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def evaluator_failed(message: str) -> ApiError:
    return ApiError(502, "evaluator_failed", message)


async def readable_saved_query_version(conn: AsyncConnection, p: Principal, version_id: str) -> dict:
    """rule 3: any Version of a query the key reads, with grants on that Version's Corpora too;
    else 422 unknown_saved_query (field /saved_query_version_id)."""
    row = await views.saved_query_version_row(conn, p.org_id, version_id)
    head = None if row is None else await views.saved_query_head(conn, p.org_id, row["saved_query_id"])
    if head is None or not views.covers_all(p, head.corpus_ids) or not views.covers_all(p, row["corpus_ids"]):
        raise ApiError(422, "unknown_saved_query", "No Saved Query Version this key may read has this id.",
                       field="/saved_query_version_id")
    return row


_CANDIDATES = """
SELECT v.version_id, v.record_id, v.corpus_id, v.manifest, v.provenance, v.extensions, v.accepted_at,
       rec.namespace, rec.record_key,
       (v.enriched AND EXISTS (SELECT 1 FROM corpora c WHERE c.org_id = v.org_id AND c.corpus_id = v.corpus_id
                               AND c.vector_spaces <> '[]'::jsonb)) AS enriched
FROM records rec JOIN versions v ON v.version_id = rec.current_version_id
WHERE rec.org_id = %s AND rec.corpus_id = ANY(%s) AND NOT rec.withdrawn AND v.searchable
ORDER BY v.accepted_at DESC, v.version_id DESC
LIMIT %s
"""


async def candidates(conn: AsyncConnection, org_id: str, corpus_ids: list[str], limit: int) -> list[dict]:
    """The `limit` most recently accepted current, searchable, non-withdrawn Versions of the Corpora,
    newest `accepted_at` first, each with its subscription request `record`."""
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_CANDIDATES, (org_id, corpus_ids, limit))
    out = []
    for row in await cur.fetchall():
        version = RecordVersion(corpus_id=row["corpus_id"], record_id=row["record_id"],
                                record_version_id=row["version_id"], namespace=row["namespace"],
                                record_key=row["record_key"], accepted_at=iso(row["accepted_at"]),
                                manifest=row["manifest"], provenance=row["provenance"] or {},
                                extensions=row["extensions"])
        out.append(record_object(version, enriched=row["enriched"]))
    return out


async def _decide(client: PluginClient, org_id: str, records: list[dict], evaluation: tuple[dict, dict],
                  configuration: dict, settings: Settings) -> list[dict]:
    """One request per candidate Version, `evaluation_concurrency` at a time, all within
    `preview_timeout_seconds`; the decision of each, in the candidates' order."""
    deadline = time.monotonic() + settings.monitoring.preview_timeout_seconds
    gate = asyncio.Semaphore(settings.monitoring.evaluation_concurrency)

    async def one(record: dict) -> dict:
        async with gate:
            batch = preview_batch(record["record_version_id"], *evaluation)
            request = subscription_request(new_id("inv"), org_id, record, batch, configuration)
            remaining = max(0.001, deadline - time.monotonic())
            answer = await client.invoke("subscription", request,
                                         min(float(settings.monitoring.evaluator_timeout_seconds), remaining))
            return check_answer(answer, batch.ids, part_keys(record))["e1"]

    try:
        async with asyncio.timeout(settings.monitoring.preview_timeout_seconds):
            await client.verify()
            return list(await asyncio.gather(*(one(r) for r in records)))
    except TimeoutError:
        raise evaluator_unavailable(f"The evaluator did not decide within "
                                    f"{settings.monitoring.preview_timeout_seconds} s.") from None
    except PluginUnreachable as exc:
        raise evaluator_unavailable(f"The evaluator is unreachable ({exc.cause}).") from None
    except PluginFailed as exc:
        if exc.retryable:  # a transient refusal: like unreachable, try again later
            raise evaluator_unavailable(f"The evaluator answered a retryable error {exc.code}.") from None
        raise evaluator_failed(f"The evaluator answered a terminal error {exc.code}: {exc.message}") from None
    except InvalidOutput as exc:
        raise evaluator_failed(f"The evaluator's answer is invalid: {exc}") from None


@dataclass(frozen=True)
class Prepared:
    """What calling the evaluator needs, read from the database before any call."""

    records: list[dict]
    provider: Provider | None
    evaluation: tuple[dict, dict]  # the Saved Query Version's expression, the evaluator configuration


async def prepare(conn: AsyncConnection, p: Principal, settings: Settings, req: PreviewRequest) -> Prepared:
    """The checks of createSubscription's order (decisions.md), then the candidates."""
    row = await readable_saved_query_version(conn, p, req.saved_query_version_id)
    served = await installed_evaluator(conn, req.evaluator.plugin_id, req.evaluator.version)
    check_against_evaluator(served.expression_schema, served.configuration_schema, row["expression"],
                            req.evaluator.configuration)
    records = await candidates(conn, p.org_id, row["corpus_ids"], req.limit)
    provider = await load_provider(conn, settings, served.registration_id) if records else None
    return Prepared(records, provider, (row["expression"], req.evaluator.configuration))


async def evaluate(prepared: Prepared, org_id: str, settings: Settings) -> Preview:
    if not prepared.records:
        return Preview(items=[], evaluated=0, matched=0)
    provider = prepared.provider
    if provider is None:
        raise evaluator_unavailable("The installed evaluator's registration cannot be read.")
    client = ROUTE_CLIENTS.client(provider.target)
    decisions = await _decide(client, org_id, prepared.records, prepared.evaluation,
                              provider.settings.configuration, settings)
    items = [PreviewItem(record_id=r["record_id"], version_id=r["record_version_id"], corpus_id=r["corpus_id"],
                         decision=d["decision"], evidence=d.get("evidence"))
             for r, d in zip(prepared.records, decisions)]
    return Preview(items=items, evaluated=len(items), matched=sum(i.decision == "match" for i in items))


@operation("previewSubscription", "POST", "/v0/subscription-previews", permission=WRITE, body=PreviewRequest,
           responses={200: Preview})
async def preview_subscription(call: Call[PreviewRequest, None]) -> Response:
    svc = services(call.request)
    # The candidates are read first and the connection returned before the evaluator is called,
    # so a slow evaluator holds no database connection.
    async with svc.pool.connection() as conn:
        prepared = await prepare(conn, call.principal, svc.settings, call.body)
    return respond(await evaluate(prepared, call.principal.org_id, svc.settings))


ROUTES = [preview_subscription]
