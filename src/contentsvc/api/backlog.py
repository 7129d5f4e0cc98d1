"""Ingest backpressure: 429 `ingest_backlog` while the folds are far behind what was accepted.

A 202 promises that a write will be processed, not when. Accepting faster than the folds
process, for long, only grows a queue nobody sees: Receipts pending for minutes, searches
minutes stale, and a drain that outlasts the burst. So, as Elasticsearch refuses bulk requests
with 429 while its write queue is full, ingests and withdrawals answer 429 with Retry-After
while the oldest journal event that a fold on the way to searchable has not processed is older
than `[ingest] max_backlog_seconds` (default 60; 0 never refuses). Those folds are the
materializer (Receipts resolve there), the read model and the serving lexical generation. The
vectors fold is not one of them: embedding lags by design, and `record.enriched` says when it
has caught up (docs/decisions.md "Ingest backlog").

The age is read at most once a second, by one request while the others wait for it: one
indexed read of the journal per second under load, none when nobody ingests. The API logs
`ingest_backlog` (a warning) when it starts refusing and `ingest_backlog_cleared` when it stops.
"""

from __future__ import annotations

import asyncio
import math
import time

from contentsvc.domain.errors import ApiError
from contentsvc.logging import get_logger
from contentsvc.readmodel.changes import FEED_PROJECTOR
from contentsvc.search import generations

log = get_logger("contentsvc.api.backlog")

REFRESH_SECONDS = 1.0
RETRY_AFTER_SECONDS = 5

# Projectors/materializer.py's name: importing that module would load the plugin contract check
# into the API for one string.
MATERIALIZER = "materializer"

# The age of the first event after the least advanced of the named checkpoints (none: 0).
_OLDEST_UNFOLDED_AGE = """
SELECT extract(epoch FROM clock_timestamp() - committed_at)::float8
  FROM journal
 WHERE position > (SELECT min(position) FROM projector_checkpoints WHERE name = ANY(%s))
 ORDER BY position
 LIMIT 1
"""


class IngestBacklog:
    """How far behind the folds are, read from the journal and refused above the limit."""

    def __init__(self, pool, max_seconds: int) -> None:
        self.pool = pool
        self.max_seconds = max_seconds
        self.seconds = 0.0
        self._read_at = -math.inf
        self._reading = asyncio.Lock()

    async def refuse_when_behind(self) -> None:
        """Raises 429 `ingest_backlog` while the backlog is older than the limit."""
        if not self.max_seconds:
            return
        if time.monotonic() - self._read_at >= REFRESH_SECONDS:
            async with self._reading:
                if time.monotonic() - self._read_at >= REFRESH_SECONDS:  # not read while this waited
                    self._observe(await self._oldest_unfolded_age())
                    self._read_at = time.monotonic()
        if self.seconds > self.max_seconds:
            raise ApiError(
                429, "ingest_backlog",
                f"Processing is {int(self.seconds)} s behind what was accepted (the limit is {self.max_seconds} s);"
                " nothing was accepted. Retry after Retry-After seconds.",
                retryable=True, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    def _observe(self, seconds: float) -> None:
        behind, was_behind = seconds > self.max_seconds, self.seconds > self.max_seconds
        if behind and not was_behind:
            log.warning("ingest_backlog", behind_s=round(seconds, 1), limit_s=self.max_seconds)
        elif was_behind and not behind:
            log.info("ingest_backlog_cleared", behind_s=round(seconds, 1), limit_s=self.max_seconds)
        self.seconds = seconds

    async def _oldest_unfolded_age(self) -> float:
        async with self.pool.connection() as conn:
            lexical = await generations.serving(conn, generations.LEXICAL)
            folds = [MATERIALIZER, FEED_PROJECTOR] + ([lexical.checkpoint_name] if lexical else [])
            cur = await conn.execute(_OLDEST_UNFOLDED_AGE, (folds,))
            row = await cur.fetchone()
        return max(0.0, row[0]) if row and row[0] is not None else 0.0
