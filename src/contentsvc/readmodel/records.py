"""Read views of Records and their Versions, shaped as the contract's responses.

Each loader takes the caller's Principal and returns only what that key may
see: another Organization's rows and Corpora outside the scope read as absent.
"""

from __future__ import annotations

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.auth.principal import Principal
from contentsvc.domain.clock import iso
from contentsvc.domain.models import (
    Record,
    RelationView,
    SourceIdentityView,
    Version,
)
from contentsvc.readmodel.processing import availability_view, live_diagnostics, version_processing


def record_view(r: dict) -> Record:
    return Record(
        record_id=r["record_id"],
        source=SourceIdentityView(corpus_id=r["corpus_id"], namespace=r["namespace"], record_key=r["record_key"]),
        current_version_id=r["current_version_id"],
        withdrawn=r["withdrawn"],
    )


async def load_record(conn: AsyncConnection, p: Principal, record_id: str) -> Record | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT record_id, corpus_id, namespace, record_key, current_version_id, withdrawn"
        " FROM records WHERE record_id = %s AND org_id = %s",
        (record_id, p.org_id),
    )
    row = await cur.fetchone()
    if row is None or not p.covers(row["corpus_id"]):
        return None
    return record_view(row)


async def list_records(conn: AsyncConnection, p: Principal, corpus_id: str, after: str | None, limit: int) -> list[Record]:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT record_id, corpus_id, namespace, record_key, current_version_id, withdrawn"
        " FROM records WHERE org_id = %s AND corpus_id = %s AND record_id > %s"
        " ORDER BY record_id LIMIT %s",
        (p.org_id, corpus_id, after or "", limit),
    )
    return [record_view(r) for r in await cur.fetchall()]


async def _expand_relations(conn: AsyncConnection, p: Principal, relations: list[dict]) -> list[RelationView]:
    """A link is available when its target Record has a current eligible Version: not withdrawn,
    and the current Version not quarantined (a quarantined Version serves no one). An unavailable
    link reveals neither a target id nor why (part 1 rule 4)."""
    if not relations:
        return []
    targets = [r["target"] for r in relations]
    cur = await conn.execute(
        "SELECT t.i, rec.record_id, rec.current_version_id FROM unnest(%s::text[], %s::text[], %s::text[])"
        " WITH ORDINALITY AS t(c, n, k, i)"
        " JOIN records rec ON rec.org_id = %s AND rec.corpus_id = t.c AND rec.namespace = t.n"
        "  AND rec.record_key = t.k AND NOT rec.withdrawn"
        " JOIN versions cv ON cv.version_id = rec.current_version_id AND cv.availability_state <> 'quarantined'",
        ([t["corpus_id"] for t in targets], [t["namespace"] for t in targets],
         [t["record_key"] for t in targets], p.org_id),
    )
    found = {row[0] - 1: (row[1], row[2]) for row in await cur.fetchall()}
    out = []
    for i, rel in enumerate(relations):
        t = rel["target"]
        hit = found.get(i) if p.covers(t["corpus_id"]) else None
        out.append(
            RelationView(
                relation=rel["relation"],
                target_source=SourceIdentityView(**t),
                available=hit is not None,
                target_record_id=hit[0] if hit else None,
                target_version_id=hit[1] if hit else None,
            )
        )
    return out


async def load_version(conn: AsyncConnection, p: Principal, record_id: str, version_id: str) -> Version | None:
    cur = conn.cursor(row_factory=dict_row)
    await cur.execute(
        "SELECT v.*, rec.namespace, rec.record_key,"
        "       (NOT v.enriched AND EXISTS (SELECT 1 FROM corpora c WHERE c.org_id = v.org_id"
        "        AND c.corpus_id = v.corpus_id AND c.vector_spaces <> '[]'::jsonb)) AS awaits_vectors,"
        "       (rec.current_version_id = v.version_id AND NOT rec.withdrawn) AS is_current"
        " FROM versions v JOIN records rec ON rec.record_id = v.record_id"
        " WHERE v.version_id = %s AND v.record_id = %s AND v.org_id = %s",
        (version_id, record_id, p.org_id),
    )
    v = await cur.fetchone()
    if v is None or not p.covers(v["corpus_id"]):
        return None
    processing = version_processing(v["availability_state"], v["awaits_vectors"], bool(v["is_current"]),
                                    v["enrichment_blocked"])
    return Version(
        version_id=v["version_id"],
        record_id=v["record_id"],
        source=SourceIdentityView(corpus_id=v["corpus_id"], namespace=v["namespace"], record_key=v["record_key"]),
        availability=availability_view(v["availability_state"], v["searchable"], bool(v["is_current"])),
        manifest=v["manifest"],
        processing=processing,
        relations=await _expand_relations(conn, p, v["relations"]),
        provenance=v["provenance"],
        extensions=v["extensions"],
        language=v["language"],
        diagnostics=live_diagnostics(v["diagnostics"], processing, v["enrichment_blocked"]),
        created_at=iso(v["created_at"]),
        accepted_at=iso(v["accepted_at"]),
    )


