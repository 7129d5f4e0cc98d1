"""What a search reads before it ranks, kept per API process: each requested Corpus's vector
spaces and routed projection generation, and the serving lexical generation.

They change rarely (a Corpus created or reconfigured, a rebuild's cutover, a replay), and a
trigger announces every change on ROUTES_CHANNEL (schema/027); the API's listening connection
then drops everything (storage/notified_cache.py: the next request reads the database). Reading
them took about 0.3 ms of a 3 ms lexical search.
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import AsyncConnection

from contentsvc.search import generations
from contentsvc.storage.notified_cache import NotifiedCache

ROUTES_CHANNEL = "contentsvc_search_routes"
MAX_ENTRIES = 10_000  # (Organization, Corpora) scopes; past it the cache starts again empty


class CorpusRoute(NamedTuple):
    corpus_id: str
    vector_spaces: list[str]
    projection_generation_id: str


class Routes(NamedTuple):
    corpora: tuple[CorpusRoute, ...]  # the requested Corpora that exist, in no particular order
    lexical_generation: str | None


class CorpusRoutes(NotifiedCache[tuple[str, tuple[str, ...]], Routes]):
    def __init__(self) -> None:
        super().__init__(MAX_ENTRIES)

    async def routes(self, conn: AsyncConnection, org_id: str, corpus_ids: list[str]) -> Routes:
        """Cached even before the first lexical generation exists: its creation is announced too."""
        return await self.get((org_id, tuple(corpus_ids)), lambda _: _read(conn, org_id, corpus_ids))


async def _read(conn: AsyncConnection, org_id: str, corpus_ids: list[str]) -> Routes:
    # One round trip for both: the Corpora, and the serving lexical generation beside them.
    cur = await conn.execute(
        "SELECT corpus_id, vector_spaces, projection_generation_id FROM corpora"
        " WHERE org_id = %s AND corpus_id = ANY(%s)"
        " UNION ALL SELECT NULL, NULL, generation_id FROM search_generations WHERE kind = %s AND state = 'serving'",
        (org_id, corpus_ids, generations.LEXICAL))
    rows = await cur.fetchall()
    return Routes(tuple(CorpusRoute(*row) for row in rows if row[0] is not None),
                  next((row[2] for row in rows if row[0] is None), None))
