"""The indexed and the current vectors of non-withdrawn Records.

The `vectors` table keeps every vector ever embedded (a Version replaced or
withdrawn keeps its rows, so nothing is embedded twice); what an hnswlib
generation holds are those of each Record's newest servable Version (current,
or building to replace the current one); what a vector space covers, and
what a search may rank, are those of the current ones. Those joins are the
concept; every reader of them goes through here: the vectors projector
opening a generation, `projector replay vectors`, listVectorSpaces'
coverage, and semantic search reading the labels its scope allows before it
ranks (part 1 rule 20).
"""

from __future__ import annotations

from psycopg import AsyncConnection

_CURRENT = ("FROM vectors x JOIN records r ON r.record_id = x.record_id"
            " WHERE x.space = %s AND r.current_version_id = x.version_id AND NOT r.withdrawn")
# What an hnswlib generation holds: each Record's newest servable Version, current or still
# building (it becomes current without the vectors projector hearing of it; hydration serves
# only the current one).
_INDEXED = ("FROM vectors x JOIN records r ON r.record_id = x.record_id"
            " WHERE x.space = %s AND r.latest_version_id = x.version_id AND NOT r.withdrawn")

# What a search may cite: the current vectors of searchable Versions, in the caller's
# Organization and requested Corpora, of the filter's source namespaces when it has one.
# Both sides are bounded by the scope (index vectors_by_corpus, records_by_corpus), so
# the read costs what the scope holds, not what the deployment does. A Version id names one
# Record, so the current Version alone joins them: with the Record's id as a second join key
# the planner expected one row out of thousands and looked each Version up in turn (SciFact:
# 25-49 ms against 14-17 for the same rows). _CURRENT and _INDEXED keep the Record's id: bounded
# by the vectors' side alone, they look each Record up by its primary key.
_SERVABLE = ("FROM vectors x JOIN records r ON r.current_version_id = x.version_id"
             " JOIN versions v ON v.version_id = x.version_id"
             " WHERE x.space = %(space)s AND x.org_id = %(org)s AND x.corpus_id = ANY(%(corpora)s)"
             " AND r.org_id = %(org)s AND r.corpus_id = ANY(%(corpora)s) AND NOT r.withdrawn AND v.searchable"
             " AND (%(namespaces)s::text[] IS NULL OR r.namespace = ANY(%(namespaces)s::text[]))")


async def after_label(conn: AsyncConnection, space: str, label: int) -> list[tuple[int, bytes]]:
    """(label, vector) of the indexed vectors labelled after `label`, in label order."""
    cur = await conn.execute(f"SELECT x.label, x.vector {_INDEXED} AND x.label > %s ORDER BY x.label", (space, label))
    return await cur.fetchall()


async def labels_through(conn: AsyncConnection, space: str, label: int) -> set[int]:
    """Labels of the indexed vectors labelled `label` or lower."""
    cur = await conn.execute(f"SELECT x.label {_INDEXED} AND x.label <= %s", (space, label))
    return {r[0] for r in await cur.fetchall()}


async def coverage(conn: AsyncConnection, space: str, org_id: str, corpus_id: str) -> int:
    """How many current segments of a Corpus hold a vector in the space."""
    cur = await conn.execute(f"SELECT count(*) {_CURRENT} AND x.org_id = %s AND x.corpus_id = %s",
                             (space, org_id, corpus_id))
    return (await cur.fetchone())[0]


async def uncovered(conn: AsyncConnection, space: str, org_id: str, corpus_ids: list[str]) -> list[str]:
    """The Corpora among `corpus_ids` whose coverage in the space is zero, in request order."""
    cur = await conn.execute(
        f"SELECT c FROM unnest(%s::text[]) WITH ORDINALITY AS u(c, i) WHERE NOT EXISTS (SELECT 1 {_CURRENT}"
        " AND x.org_id = %s AND x.corpus_id = u.c AND r.org_id = %s AND r.corpus_id = u.c) ORDER BY u.i",
        (corpus_ids, space, org_id, org_id))
    return [r[0] for r in await cur.fetchall()]


def _scope(space: str, org_id: str, corpus_ids: list[str], namespaces: list[str] | None) -> dict:
    return {"space": space, "org": org_id, "corpora": corpus_ids, "namespaces": namespaces}


async def servable(conn: AsyncConnection, space: str, org_id: str, corpus_ids: list[str],
                   namespaces: list[str] | None) -> list[tuple[int, str]]:
    """(label, version_id) of every vector a search in this scope may rank and cite."""
    cur = await conn.execute(f"SELECT x.label, x.version_id {_SERVABLE}",
                             _scope(space, org_id, corpus_ids, namespaces))
    return await cur.fetchall()


async def stored(conn: AsyncConnection, labels: list[int]) -> list[tuple[int, bytes]]:
    """(label, vector) of the given labels, as the vectors projector stored them."""
    cur = conn.cursor(binary=True)
    await cur.execute("SELECT label, vector FROM vectors WHERE label = ANY(%s)", (labels,))
    return await cur.fetchall()


async def segments(conn: AsyncConnection, labels: list[int]) -> dict[int, tuple[str, str, str, int]]:
    """label -> (version_id, record_id, part_key, segment_start): the segment each vector embeds."""
    cur = await conn.execute(
        "SELECT label, version_id, record_id, part_key, segment_start FROM vectors WHERE label = ANY(%s)", (labels,))
    return {r[0]: tuple(r[1:]) for r in await cur.fetchall()}


async def uncovered_current_versions(conn: AsyncConnection) -> tuple[int, int]:
    """(current Versions, Corpora holding them) deployment-wide whose primary vectors are not all
    there yet: the Version of a non-withdrawn Record in a Corpus whose generation has a vector
    space, not yet enriched (`record.enriched` marks a Version whose segments all hold a vector,
    none included; a Version whose enrichment is blocked stays uncovered). Part 2 "Activation
    rules": changing the ingestion plugin serving a source format needs this to be (0, 0)."""
    cur = await conn.execute(
        "SELECT count(*), count(DISTINCT (r.org_id, r.corpus_id)) FROM records r"
        " JOIN versions v ON v.version_id = r.current_version_id"
        " JOIN corpora c ON c.org_id = r.org_id AND c.corpus_id = r.corpus_id"
        " WHERE NOT r.withdrawn AND NOT v.enriched AND c.vector_spaces <> '[]'::jsonb")
    versions, corpora = await cur.fetchone()
    return versions, corpora
