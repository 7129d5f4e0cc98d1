"""Read-model projector: folds public facts into the Postgres read tables.

Input: corpus.created, ingest.accepted, withdrawal.accepted,
record.accepted, record.withdrawn, record.availability_changed,
receipt.resolved. Output: the corpora, receipts, records and versions
tables, committed with the checkpoint.

Every statement is idempotent (insert-if-absent, or set to a value carried
by the event), so the API may apply the same fold inline for rows that must
be readable before the 202 leaves, and a replay from position 0 into empty
tables yields the same rows. Within a batch, statements run grouped by kind
in FOLD_ORDER: inserts before the updates that depend on them; statements
of one kind keep journal order.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent

_CORPUS = (
    "INSERT INTO corpora (org_id, corpus_id, name, retrieval, projection_generation_id, vector_spaces, created_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
_RECEIPT = (
    "INSERT INTO receipts (receipt_id, org_id, corpus_id, namespace, record_key, state, diagnostics, accepted_at)"
    " VALUES (%s, %s, %s, %s, %s, 'pending', '[]', %s) ON CONFLICT DO NOTHING"
)
_RECORD_VERSION = (
    "WITH r AS (INSERT INTO records (record_id, org_id, corpus_id, namespace, record_key, current_version_id,"
    "                               withdrawn, created_at)"
    "           VALUES (%(record_id)s, %(org_id)s, %(corpus_id)s, %(namespace)s, %(record_key)s, %(version_id)s,"
    "                   false, %(created_at)s)"
    "           ON CONFLICT (record_id) DO UPDATE SET current_version_id = EXCLUDED.current_version_id)"
    " INSERT INTO versions (version_id, record_id, org_id, corpus_id, receipt_id, manifest, provenance, extensions,"
    "                       relations, diagnostics, availability_state, searchable, accepted_at, created_at)"
    " VALUES (%(version_id)s, %(record_id)s, %(org_id)s, %(corpus_id)s, %(receipt_id)s, %(manifest)s,"
    "         %(provenance)s, %(extensions)s, %(relations)s, '[]', 'materialized', false, %(accepted_at)s,"
    "         %(created_at)s)"
    " ON CONFLICT DO NOTHING"
)
_WITHDRAWN = (
    "INSERT INTO records (record_id, org_id, corpus_id, namespace, record_key, current_version_id, withdrawn,"
    " created_at) VALUES (%s, %s, %s, %s, %s, %s, true, %s)"
    " ON CONFLICT (record_id) DO UPDATE SET withdrawn = true"
)
_AVAILABILITY = "UPDATE versions SET availability_state = %s, searchable = %s WHERE version_id = %s"
_RESOLVED = (
    "UPDATE receipts SET state = 'resolved', outcome = %s, record_id = %s, version_id = %s,"
    " diagnostics = %s, resolved_at = %s WHERE receipt_id = %s"
)


def _corpus(e) -> tuple:
    p = e.payload
    return (e.org_id, p["corpus_id"], p["name"], Jsonb(p["retrieval"]), p["projection_generation_id"],
            Jsonb(p["vector_spaces"]), p["created_at"])


def _receipt(e) -> tuple:
    p = e.payload
    s = p["source"]
    return (p["receipt_id"], e.org_id, s["corpus_id"], s["namespace"], s["record_key"], p["accepted_at"])


def _record_version(e) -> dict:
    p = e.payload
    s = p["source"]
    return {
        "record_id": p["record_id"], "org_id": e.org_id, "corpus_id": s["corpus_id"],
        "namespace": s["namespace"], "record_key": s["record_key"], "version_id": p["version_id"],
        "receipt_id": p["receipt_id"], "manifest": Jsonb(p["manifest"]), "provenance": Jsonb(p["provenance"]),
        "extensions": Jsonb(p["extensions"]) if p.get("extensions") else None,
        "relations": Jsonb(p["relations"]), "accepted_at": p["accepted_at"], "created_at": p["created_at"],
    }


def _withdrawn(e) -> tuple:
    p = e.payload
    s = p["source"]
    return (p["record_id"], e.org_id, s["corpus_id"], s["namespace"], s["record_key"], None, p["withdrawn_at"])


def _availability(e) -> tuple | None:
    p = e.payload
    if "state" not in p:  # only currentness moved; is_current is derived from records
        return None
    return (p["state"], p["searchable"], p["version_id"])


def _resolved(e) -> tuple:
    p = e.payload
    return (p["outcome"], p["record_id"], p["version_id"], Jsonb(p["diagnostics"]), p["resolved_at"], p["receipt_id"])


# kind -> (SQL, row builder), in the order the groups are applied.
FOLD_ORDER = [
    (ev.CORPUS_CREATED, _CORPUS, _corpus),
    (ev.INGEST_ACCEPTED, _RECEIPT, _receipt),
    (ev.WITHDRAWAL_ACCEPTED, _RECEIPT, _receipt),
    (ev.RECORD_ACCEPTED, _RECORD_VERSION, _record_version),
    (ev.RECORD_WITHDRAWN, _WITHDRAWN, _withdrawn),
    (ev.RECORD_AVAILABILITY_CHANGED, _AVAILABILITY, _availability),
    (ev.RECEIPT_RESOLVED, _RESOLVED, _resolved),
]
FOLDED_KINDS = frozenset(kind for kind, _, _ in FOLD_ORDER)


async def fold(conn: AsyncConnection, events: list[JournalEvent] | list[NewEvent]) -> None:
    """Apply events to the read tables (inside the caller's transaction)."""
    by_kind: dict[str, list] = {}
    for e in events:
        if e.kind in FOLDED_KINDS:
            by_kind.setdefault(e.kind, []).append(e)
    if not by_kind:
        return
    async with conn.cursor() as cur:
        for kind, sql, row in FOLD_ORDER:
            rows = [r for r in map(row, by_kind.get(kind, ())) if r is not None]
            if rows:
                await cur.executemany(sql, rows)


class ReadModelProjector:
    name = "readmodel"

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        await fold(conn, events)
