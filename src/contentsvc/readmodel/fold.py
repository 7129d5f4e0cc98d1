"""The read tables' fold: public facts into corpora, receipts, records, versions, uploads, blobs.

The read-model projector runs it over the journal; commands run it inline, in
their own transaction, for the rows that must be readable before the 202 leaves.

Input: corpus.created, ingest.accepted, withdrawal.accepted,
record.accepted, record.withdrawn, record.availability_changed,
record.enriched, record.enrichment_blocked, receipt.resolved, upload.created, upload.received, upload.verified,
upload.failed, blob.collected, saved_query.committed, subscription.committed. Output: the corpora,
receipts, records, versions, uploads and blobs tables, and the saved query and subscription tables
(monitoring/views.py), committed with the checkpoint.

Every statement is idempotent (insert-if-absent, or set to a value carried
by the event), so the API may apply the same fold inline for rows that must
be readable before the 202 leaves, and a replay from position 0 into empty
tables yields the same rows. Within a batch, statements run grouped by kind
in FOLD_ORDER: inserts before the updates that depend on them; within a
kind, the last event for a row wins, as if applied one by one.
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.domain import operations
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.monitoring.views import fold_monitoring

# Each statement folds a whole group of events at once: column arrays in,
# unnest() on the server. Statements that set a row to a value dedupe their
# rows first, keeping the last event per row (ON CONFLICT DO UPDATE and
# UPDATE ... FROM may touch a row only once per statement).
_CORPUS = """
INSERT INTO corpora (org_id, corpus_id, name, retrieval, projection_generation_id, vector_spaces, created_at)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::jsonb[], %b::text[], %b::jsonb[], %b::timestamptz[])
ON CONFLICT DO NOTHING
"""
# A Corpus's first projection generation serves from the start (positions 0: any
# Operation on the Corpus is accepted after it).
_FIRST_PROJECTION = """
INSERT INTO corpus_projections (projection_generation_id, org_id, corpus_id, retrieval, vector_spaces, state,
                                accepted_position, config_position)
SELECT *, 'serving', 0, 0 FROM unnest(%b::text[], %b::text[], %b::text[], %b::jsonb[], %b::jsonb[])
ON CONFLICT DO NOTHING
"""
# The routed generation and effective configuration move at a cutover.
_RETRIEVAL_CHANGED = """
UPDATE corpora c SET retrieval = u.retrieval, projection_generation_id = u.generation, vector_spaces = u.spaces
FROM unnest(%b::text[], %b::text[], %b::text[], %b::jsonb[], %b::text[], %b::jsonb[])
     AS u(corpus_key, org_id, corpus_id, retrieval, generation, spaces)
WHERE c.org_id = u.org_id AND c.corpus_id = u.corpus_id
"""
# Operations: each event carries the members that moved; the rules of
# domain/operations.merge (a terminal state sticks, a cancel request is not
# hidden by work reports) in SQL.
_OPERATION = """
INSERT INTO operations AS o (operation_id, org_id, corpus_id, doc, request)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::jsonb[], %b::jsonb[])
ON CONFLICT (operation_id) DO UPDATE SET
    doc = CASE
        WHEN o.doc->>'state' IN ('succeeded', 'failed', 'canceled') THEN o.doc
        WHEN o.doc->>'state' = 'cancel_requested' AND EXCLUDED.doc->>'state' IN ('queued', 'running')
            THEN o.doc || EXCLUDED.doc || '{"state": "cancel_requested"}'::jsonb
        ELSE o.doc || EXCLUDED.doc END,
    updated_at = now()
"""
_RECEIPT = """
INSERT INTO receipts (receipt_id, org_id, corpus_id, namespace, record_key, accepted_at, state, diagnostics)
SELECT *, 'pending', '[]'::jsonb
FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::timestamptz[])
ON CONFLICT DO NOTHING
"""
# A new Version is not current (projectors/currentness.py): record.accepted moves only
# the newest servable Version; a quarantined one (latest null here) moves nothing.
_RECORD = """
INSERT INTO records (record_id, org_id, corpus_id, namespace, record_key, latest_version_id, created_at, withdrawn)
SELECT *, false FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
                            %b::timestamptz[])
ON CONFLICT (record_id) DO UPDATE SET latest_version_id = coalesce(EXCLUDED.latest_version_id,
                                                                   records.latest_version_id)
"""
# The current Version moves with the availability event that makes a Version current.
_MADE_CURRENT = """
UPDATE records r SET current_version_id = u.version_id
FROM unnest(%b::text[], %b::text[]) AS u(record_id, version_id)
WHERE r.record_id = u.record_id
"""
_VERSION = """
INSERT INTO versions (version_id, record_id, org_id, corpus_id, receipt_id, manifest, provenance, extensions,
                      relations, accepted_at, created_at, diagnostics, language, availability_state, searchable)
SELECT *, 'materialized', false
FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::jsonb[], %b::jsonb[], %b::jsonb[],
            %b::jsonb[], %b::timestamptz[], %b::timestamptz[], %b::jsonb[], %b::text[])
ON CONFLICT DO NOTHING
"""
_WITHDRAWN = """
INSERT INTO records (record_id, org_id, corpus_id, namespace, record_key, created_at, withdrawn)
SELECT *, true FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::timestamptz[])
ON CONFLICT (record_id) DO UPDATE SET withdrawn = true
"""
# Quarantine is terminal (part 1: reprocessing quarantined Versions is unavailable). A move to
# the state the row already has writes nothing: every Version's `materialized` comes in the
# transaction that inserted it so, and an update rewrites the whole row, its manifest included.
_AVAILABILITY = """
UPDATE versions v SET availability_state = u.state, searchable = u.searchable
FROM unnest(%b::text[], %b::text[], %b::bool[]) AS u(version_id, state, searchable)
WHERE v.version_id = u.version_id AND v.availability_state <> 'quarantined'
  AND (v.availability_state, v.searchable) IS DISTINCT FROM (u.state, u.searchable)
"""
_ENRICHED = """
UPDATE versions v SET enriched = true, enrichment_blocked = NULL
FROM unnest(%b::text[]) AS u(version_id) WHERE v.version_id = u.version_id
"""
# Blocked until enriched: an enriched Version is never blocked again.
_ENRICHMENT_BLOCKED = """
UPDATE versions v SET enrichment_blocked = u.diagnostic
FROM unnest(%b::text[], %b::jsonb[]) AS u(version_id, diagnostic) WHERE v.version_id = u.version_id AND NOT v.enriched
"""
_RESOLVED = """
UPDATE receipts r SET state = 'resolved', outcome = u.outcome, record_id = u.record_id, version_id = u.version_id,
                      diagnostics = u.diagnostics, resolved_at = u.resolved_at
FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::jsonb[], %b::timestamptz[])
     AS u(receipt_id, outcome, record_id, version_id, diagnostics, resolved_at)
WHERE r.receipt_id = u.receipt_id
"""
# Uploads: each step moves a row only forward (`step`, see schema/005_uploads.sql).
_UPLOAD_CREATED = """
INSERT INTO uploads (upload_id, org_id, blob_id, media_type, size_bytes, sha256, filename, expires_at, created_at,
                     state, step)
SELECT *, 'awaiting_upload', 0
FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::int8[], %b::text[], %b::text[],
            %b::timestamptz[], %b::timestamptz[])
ON CONFLICT DO NOTHING
"""
_UPLOAD_RECEIVED = """
UPDATE uploads up SET state = 'verifying', step = 1, received_size = u.size, received_sha256 = u.sha256,
                      storage_key = u.storage_key
FROM unnest(%b::text[], %b::int8[], %b::text[], %b::text[]) AS u(upload_id, size, sha256, storage_key)
WHERE up.upload_id = u.upload_id AND up.step < 1
"""
_UPLOAD_VERIFIED = """
UPDATE uploads up SET state = 'verified', step = 2
FROM unnest(%b::text[]) AS u(upload_id)
WHERE up.upload_id = u.upload_id AND up.step < 2
"""
_BLOB = """
INSERT INTO blobs (blob_id, org_id, upload_id, media_type, size_bytes, sha256, storage_key, created_at)
SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::int8[], %b::text[], %b::text[],
                     %b::timestamptz[])
ON CONFLICT DO NOTHING
"""
_BLOB_COLLECTED = """
UPDATE blobs b SET collected_at = u.collected_at
FROM unnest(%b::text[], %b::timestamptz[]) AS u(blob_id, collected_at)
WHERE b.blob_id = u.blob_id AND b.collected_at IS NULL
"""
_UPLOAD_FAILED = """
UPDATE uploads up SET state = 'failed', step = 2, error = u.error
FROM unnest(%b::text[], %b::jsonb[]) AS u(upload_id, error)
WHERE up.upload_id = u.upload_id AND up.step < 2
"""


def _corpus(e) -> tuple:
    p = e.payload
    return (e.org_id, p.corpus_id, p.name, Jsonb(p.retrieval), p.projection_generation_id, Jsonb(p.vector_spaces),
            p.created_at)


def _first_projection(e) -> tuple:
    p = e.payload
    return (p.projection_generation_id, e.org_id, p.corpus_id, Jsonb(p.retrieval), Jsonb(p.vector_spaces))


def _retrieval_changed(e) -> tuple:
    p = e.payload
    return (f"{e.org_id}/{e.corpus_id}", e.org_id, e.corpus_id, Jsonb(p.retrieval), p.projection_generation_id,
            Jsonb(p.vector_spaces))


def _operation(e) -> tuple:
    p = e.payload
    # As documents: the in-batch merge (domain/operations.merge) works on the members present.
    return (p.operation.operation_id, e.org_id, e.corpus_id, Jsonb(msgspec.to_builtins(p.operation)),
            Jsonb(msgspec.to_builtins(p.request) if p.request is not UNSET else {}))


def _operation_moves(earlier: tuple, later: tuple) -> tuple:
    return earlier[:3] + (Jsonb(operations.merge(earlier[3].obj, later[3].obj)),
                          earlier[4] if earlier[4].obj else later[4])


def _receipt(e) -> tuple:
    p = e.payload
    s = p.source
    return (p.receipt_id, e.org_id, s.corpus_id, s.namespace, s.record_key, p.accepted_at)


def _record(e) -> tuple:
    p = e.payload
    s = p.source
    return (p.record_id, e.org_id, s.corpus_id, s.namespace, s.record_key, None if p.quarantined else p.version_id,
            p.created_at)


def _made_current(e) -> tuple | None:
    p = e.payload
    return (p.record_id, p.version_id) if p.is_current else None


def _version(e) -> tuple:
    p = e.payload
    return (p.version_id, p.record_id, e.org_id, p.source.corpus_id, p.receipt_id, Jsonb(p.manifest),
            Jsonb(p.provenance), Jsonb(p.extensions) if p.extensions else None, Jsonb(p.relations), p.accepted_at,
            p.created_at, Jsonb(p.diagnostics), p.language)


def _withdrawn(e) -> tuple:
    p = e.payload
    s = p.source
    return (p.record_id, e.org_id, s.corpus_id, s.namespace, s.record_key, p.withdrawn_at)


def _availability(e) -> tuple | None:
    p = e.payload
    if p.state is UNSET:  # only currentness moved; is_current is derived from records (_made_current)
        return None
    return (p.version_id, p.state, p.searchable)


def _enriched(e) -> tuple:
    return (e.payload.version_id,)


def _enrichment_blocked(e) -> tuple:
    return (e.payload.version_id, Jsonb(e.payload.diagnostic))


def _resolved(e) -> tuple:
    p = e.payload
    return (p.receipt_id, p.outcome, p.record_id, p.version_id, Jsonb(p.diagnostics), p.resolved_at)


def _upload_created(e) -> tuple:
    p = e.payload
    return (p.upload_id, e.org_id, p.blob_id, p.media_type, p.size_bytes, p.sha256, p.filename, p.expires_at,
            p.created_at)


def _upload_received(e) -> tuple:
    p = e.payload
    return (p.upload_id, p.size_bytes, p.sha256, p.storage_key)


def _upload_verified(e) -> tuple:
    return (e.payload.upload_id,)


def _blob(e) -> tuple:
    p = e.payload
    return (p.blob_id, e.org_id, p.upload_id, p.media_type, p.size_bytes, p.sha256, p.storage_key, p.verified_at)


def _blob_collected(e) -> tuple:
    return (e.payload.blob_id, e.payload.collected_at)


def _upload_failed(e) -> tuple:
    p = e.payload
    return (p.upload_id, Jsonb(p.error))


def _quarantine_sticks(earlier: tuple, later: tuple) -> tuple:
    # The last availability wins, except that nothing moves a Version out of quarantine.
    return earlier if earlier[1] == "quarantined" else later


def _first_wins(earlier: tuple, later: tuple) -> tuple:
    return earlier


def _last_wins(earlier: tuple, later: tuple) -> tuple:
    return later


def _newest_servable_first_creation(earlier: tuple, later: tuple) -> tuple:
    # The newest servable Version moves on (a quarantined one does not); created_at stays the first.
    return later[:5] + (later[5] or earlier[5],) + earlier[6:]


# (kinds, SQL, row builder, how two rows for one key merge, or None), applied in this order.
FOLD_ORDER = [
    ({ev.CORPUS_CREATED}, _CORPUS, _corpus, None),
    ({ev.CORPUS_CREATED}, _FIRST_PROJECTION, _first_projection, None),
    ({ev.CORPUS_RETRIEVAL_CHANGED}, _RETRIEVAL_CHANGED, _retrieval_changed, _last_wins),
    ({ev.OPERATION_CHANGED}, _OPERATION, _operation, _operation_moves),
    ({ev.INGEST_ACCEPTED, ev.WITHDRAWAL_ACCEPTED}, _RECEIPT, _receipt, None),
    ({ev.RECORD_ACCEPTED}, _RECORD, _record, _newest_servable_first_creation),
    ({ev.RECORD_ACCEPTED}, _VERSION, _version, None),
    ({ev.RECORD_WITHDRAWN}, _WITHDRAWN, _withdrawn, _last_wins),
    ({ev.RECORD_AVAILABILITY_CHANGED}, _AVAILABILITY, _availability, _quarantine_sticks),
    ({ev.RECORD_AVAILABILITY_CHANGED}, _MADE_CURRENT, _made_current, _last_wins),
    ({ev.RECEIPT_RESOLVED}, _RESOLVED, _resolved, _last_wins),
    ({ev.RECORD_ENRICHMENT_BLOCKED}, _ENRICHMENT_BLOCKED, _enrichment_blocked, _last_wins),
    ({ev.RECORD_ENRICHED}, _ENRICHED, _enriched, _last_wins),
    ({ev.UPLOAD_CREATED}, _UPLOAD_CREATED, _upload_created, None),
    ({ev.UPLOAD_RECEIVED}, _UPLOAD_RECEIVED, _upload_received, _first_wins),
    ({ev.UPLOAD_VERIFIED}, _UPLOAD_VERIFIED, _upload_verified, _first_wins),
    ({ev.UPLOAD_VERIFIED}, _BLOB, _blob, None),
    ({ev.UPLOAD_FAILED}, _UPLOAD_FAILED, _upload_failed, _first_wins),
    ({ev.BLOB_COLLECTED}, _BLOB_COLLECTED, _blob_collected, _first_wins),
]
FOLDED_KINDS = frozenset(kind for kinds, _, _, _ in FOLD_ORDER for kind in kinds)


def _columns(rows: list[tuple], merge) -> list[list]:
    """Column arrays for unnest(); rows sharing a key (first column) merged in order."""
    if merge is not None:
        by_key: dict = {}
        for row in rows:
            by_key[row[0]] = merge(by_key[row[0]], row) if row[0] in by_key else row
        rows = list(by_key.values())
    return [list(column) for column in zip(*rows)]


async def fold(conn: AsyncConnection, events: list[JournalEvent] | list[NewEvent]) -> None:
    """Apply events to the read tables (inside the caller's transaction)."""
    by_kind: dict[str, list] = {}
    for e in events:
        if e.kind in FOLDED_KINDS:
            by_kind.setdefault(e.kind, []).append(e)
    for kinds, sql, row, merge in FOLD_ORDER:
        group = [e for kind in kinds for e in by_kind.get(kind, ())]
        rows = [r for r in map(row, sorted(group, key=_order)) if r is not None] if group else []
        if rows:
            await conn.execute(sql, _columns(rows, merge))
    # Saved Queries and Subscriptions (monitoring/views.py): few events, folded one by one.
    await fold_monitoring(conn, events)


def _order(e) -> int:
    # Journal order; events not yet appended (inline folds) keep their list order.
    return getattr(e, "position", 0)
