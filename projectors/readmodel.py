"""Read-model projector: folds the journal into the Postgres read tables
(the fold itself is contentsvc.readmodel.fold, shared with the commands' inline fold)."""

from __future__ import annotations

from psycopg import AsyncConnection

from contentsvc.journal.events import JournalEvent
from contentsvc.projectors.base import TableFold
from contentsvc.readmodel.fold import fold


class ReadModelProjector(TableFold):
    name = "readmodel"
    rests_in_ingest_bursts = True  # on the way to searchable (runner.IngestBurst)
    announces_progress = True  # change streams wake on it (readmodel/changes.FEED_PROJECTOR)

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        await fold(conn, events)
