"""Read views of Ingestion Receipts, limited to the key's Organization and scope."""

from __future__ import annotations

from typing import Any

import msgspec
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from contentsvc.auth.principal import Principal
from contentsvc.domain.models import (
    Diagnostic,
    ProcessingSummary,
    Receipt,
    SourceIdentityView,
)
from contentsvc.readmodel.processing import (
    QUEUED_FOR_MATERIALIZATION,
    availability_view,
    live_diagnostics,
    version_processing,
)

# Part 1 "Diagnostic": while a normalizer plugin cannot answer, the pending Receipt says so.
RETRYING_MATERIALIZATION = ProcessingSummary(state="retrying", phase="materialization")

_RECEIPT_SQL = """
SELECT r.receipt_id, r.corpus_id, r.namespace, r.record_key, r.state, r.outcome, r.record_id,
       r.version_id, r.diagnostics, v.availability_state, v.searchable, v.enrichment_blocked,
       (NOT v.enriched AND c.vector_spaces <> '[]'::jsonb) AS awaits_vectors,
       (rec.current_version_id = r.version_id AND NOT rec.withdrawn) AS is_current,
       CASE WHEN d.attempts > 0 THEN d.last_error END AS waiting_for_plugin, pr.plugin_id AS waiting_plugin
FROM receipts r
LEFT JOIN materializer_deferred d ON d.receipt_id = r.receipt_id AND r.state = 'pending'
LEFT JOIN plugin_registrations pr ON pr.registration_id = d.registration_id
LEFT JOIN versions v ON v.version_id = r.version_id
LEFT JOIN records rec ON rec.record_id = r.record_id
LEFT JOIN corpora c ON c.org_id = r.org_id AND c.corpus_id = r.corpus_id
WHERE r.receipt_id = ANY(%s) AND r.org_id = %s
"""


def pending_receipt(receipt_id: str, source: SourceIdentityView) -> Receipt:
    return Receipt(
        receipt_id=receipt_id,
        state="pending",
        diagnostics=[],
        source=source,
        processing=QUEUED_FOR_MATERIALIZATION,
    )


async def answer_receipts(pool: AsyncConnectionPool, p: Principal, accepted: list[tuple[Any, Any]]
                          ) -> dict[str, Receipt]:
    """The Receipts an accepting request answers with, by id, from its (Accepted, command) pairs:
    a fresh one is pending, as it was just written, and needs no read; a replayed one is read
    again, as it stands now."""
    replayed = [a.receipt_id for a, _ in accepted if a.replayed]
    current: dict[str, Receipt] = {}
    if replayed:
        async with pool.connection() as conn:
            current = await load_receipts(conn, p, replayed)
    return {a.receipt_id: current.get(a.receipt_id)
            or pending_receipt(a.receipt_id, SourceIdentityView(**msgspec.to_builtins(cmd.source)))
            for a, cmd in accepted}


async def load_receipts(conn: AsyncConnection, p: Principal, receipt_ids: list[str]) -> dict[str, Receipt]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(_RECEIPT_SQL, (receipt_ids, p.org_id))
    out: dict[str, Receipt] = {}
    for r in await cur.fetchall():
        # Linked availability and diagnostics only for a caller who may read them now.
        may_read = p.may("content:read") and p.covers(r["corpus_id"])
        resolved = r["state"] == "resolved"
        is_current = bool(r["is_current"])
        waiting = r["waiting_for_plugin"] is not None
        processing = (version_processing(r["availability_state"], bool(r["awaits_vectors"]), is_current,
                                         r["enrichment_blocked"])
                      if resolved else RETRYING_MATERIALIZATION if waiting else QUEUED_FOR_MATERIALIZATION)
        diagnostics = live_diagnostics(r["diagnostics"], processing, r["enrichment_blocked"]) if may_read else []
        if waiting and may_read:
            diagnostics = [Diagnostic(code="plugin_unavailable", retryable=True, plugin=r["waiting_plugin"],
                                      contribution="normalizer",
                                      message="The normalizer plugin is unreachable or asked to be retried; "
                                              "it is called again with backoff and the Receipt resolves once "
                                              "it answers.")]
        out[r["receipt_id"]] = Receipt(
            receipt_id=r["receipt_id"],
            state=r["state"],
            outcome=r["outcome"],
            record_id=r["record_id"],
            version_id=r["version_id"],
            availability=availability_view(r["availability_state"], r["searchable"], is_current)
            if may_read
            else None,
            diagnostics=diagnostics,
            source=SourceIdentityView(corpus_id=r["corpus_id"], namespace=r["namespace"], record_key=r["record_key"]),
            processing=processing,
        )
    return out


async def load_receipt(conn: AsyncConnection, p: Principal, receipt_id: str) -> Receipt | None:
    """None when absent, another Organization's, or of a Corpus outside the scope."""
    receipt = (await load_receipts(conn, p, [receipt_id])).get(receipt_id)
    if receipt is None or not p.covers(receipt.source.corpus_id):
        return None
    return receipt
