"""The indexed and the current vectors of non-withdrawn Records.

The `vectors` table keeps every vector ever embedded (a Version replaced or
withdrawn keeps its rows, so nothing is embedded twice); what an hnswlib
generation holds are those of each Record's newest servable Version (current,
or building to replace the current one), and what a vector space covers are
those of the current ones. Those joins are the concept; every reader of them
goes through here: the vectors
projector opening a generation, `projector replay vectors`, and
listVectorSpaces' coverage.
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
