"""Garbage collection: what `contentsvc gc` and the `gc` worker delete.

Two kinds of files only grow without it:

- Index generations (home/indexes/KIND/GEN): a replay's cutover retires the
  old one. Its directory goes once it has been retired for
  `gc.retired_generation_grace_seconds` (searchers re-read the serving
  generation on every search; a projector reopens on the new one at its
  next step). Deleting is idempotent: a crash half-way leaves a directory
  the next pass removes.
- Blob bytes (home/blobs/sha256/...): an upload that received its bytes
  but was never confirmed fails `upload_expired` at its expiry (under the
  row lock confirmUpload takes, so a confirm either verified it first or
  observes the failure). A verified Blob that no ingest ever
  referenced, whose upload expired, is collected. The decision is taken in
  PostgreSQL, under the Blob's row lock, against the journal (every
  ingest.accepted names the Blobs it references), and recorded as a
  `blob.collected` event folded into the blobs row: from then on a
  reference is `unverified_blob` (an ingest share-locks the rows it
  references, readmodel/uploads.py, so it either committed before the
  decision or sees it). The bytes are deleted afterwards, under the
  content key's lock that the presigned PUT also takes, and only when no
  Blob left and no received upload holds the same content. A crash
  between the decision and the unlink leaves a file that the next pass
  deletes.

A Blob that an ingest referenced is kept for good: its Versions are
immutable and stay readable.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from psycopg import AsyncConnection

from contentsvc.config import Settings
from contentsvc.domain.clock import utc_now
from contentsvc.domain.uploads import UNCONFIRMED_ERROR
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.projectors.base import PeriodicWorker
from contentsvc.projectors.statistics import (
    STATISTICS_INTERVAL_SECONDS,
    YOUNG_INTERVAL_SECONDS,
    analyze_grown_tables,
    vacuum_queue_tables,
)
from contentsvc.readmodel.fold import fold
from contentsvc.readmodel.uploads import hold_storage_key
from contentsvc.search import generations
from contentsvc.storage.blobstore import check_key
from contentsvc.storage.server_settings import say_what_the_server_lacks

log = get_logger("contentsvc.gc")

BATCH = 500  # Blobs decided per transaction

# Verified Blobs past their upload's expiry that no ingest.accepted references
# (journal_blob_references, schema/014, answers the NOT EXISTS).
_UNREFERENCED = """
SELECT b.blob_id, b.size_bytes FROM blobs b JOIN uploads u ON u.upload_id = b.upload_id
WHERE b.collected_at IS NULL AND u.expires_at < now() AND b.blob_id > %s
  AND NOT EXISTS (SELECT 1 FROM journal j WHERE j.kind = 'ingest.accepted' AND j.payload ? 'blobs'
                  AND j.payload -> 'blobs' ? b.blob_id)
ORDER BY b.blob_id LIMIT %s
"""

# Content keys of collected Blobs and failed uploads that nothing else holds: no Blob still
# referenceable, no upload received and not yet confirmed (for a dry run, none of the `assumed`
# Blobs and uploads counts: they would be collected first).
_ORPHAN_KEYS = """
SELECT k.storage_key FROM (
    SELECT storage_key FROM blobs WHERE collected_at IS NOT NULL OR blob_id = ANY(%(blobs)s)
    UNION SELECT storage_key FROM uploads WHERE storage_key IS NOT NULL
                                            AND (state = 'failed' OR upload_id = ANY(%(uploads)s))) AS k
WHERE NOT EXISTS (SELECT 1 FROM blobs o WHERE o.storage_key = k.storage_key AND o.collected_at IS NULL
                  AND NOT o.blob_id = ANY(%(blobs)s))
  AND NOT EXISTS (SELECT 1 FROM uploads u WHERE u.storage_key = k.storage_key AND u.state = 'verifying'
                  AND NOT u.upload_id = ANY(%(uploads)s))
ORDER BY 1
"""

# Uploads whose bytes arrived but that were never confirmed, past their expiry.
_UNCONFIRMED = """
SELECT upload_id, received_size FROM uploads WHERE state = 'verifying' AND expires_at < now()
ORDER BY upload_id LIMIT %s
"""


@dataclass
class Collected:
    """What one pass removed (or, dry, would remove)."""

    generations: list[tuple[str, str, int]] = field(default_factory=list)  # kind, generation_id, bytes
    blobs: list[tuple[str, int]] = field(default_factory=list)  # blob_id, size_bytes
    uploads: list[tuple[str, int]] = field(default_factory=list)  # upload_id (received, never confirmed), bytes
    files: list[tuple[str, int]] = field(default_factory=list)  # storage key, bytes

    @property
    def bytes_freed(self) -> int:
        return sum(g[2] for g in self.generations) + sum(f[1] for f in self.files)


class Collector:
    def __init__(self, home: Path, blob_root: Path, generation_grace_seconds: int) -> None:
        self.home = home
        self.blob_root = blob_root
        self.generation_grace_seconds = generation_grace_seconds

    @classmethod
    def from_settings(cls, settings: Settings) -> "Collector":
        return cls(settings.home, settings.blob_root, settings.gc.retired_generation_grace_seconds)

    async def collect(self, conn: AsyncConnection, dry_run: bool = False) -> Collected:
        """One pass; `conn` is outside any transaction (autocommit or not)."""
        out = Collected()
        await self._generations(conn, out, dry_run)
        await self._blobs(conn, out, dry_run)
        await self._unconfirmed(conn, out, dry_run)
        await self._files(conn, out, dry_run)
        return out

    async def _generations(self, conn: AsyncConnection, out: Collected, dry_run: bool) -> None:
        async with conn.transaction():
            retired = await generations.retired_past_grace(conn, self.generation_grace_seconds)
        for generation in retired:
            directory = generation.path(self.home)
            if not directory.exists():
                continue  # deleted by an earlier pass
            size = generations.bytes_held(directory)
            if not dry_run:
                generations.delete_files(directory)
                log.info("generation_deleted", kind=generation.kind, generation=generation.generation_id,
                         bytes=size)
            out.generations.append((generation.kind, generation.generation_id, size))

    async def _blobs(self, conn: AsyncConnection, out: Collected, dry_run: bool) -> None:
        after = ""
        while True:
            async with conn.transaction():
                cur = await conn.execute(_UNREFERENCED, (after, BATCH))
                candidates = await cur.fetchall()
            if not candidates:
                return
            after = candidates[-1][0]
            if dry_run:
                out.blobs += [(blob_id, size) for blob_id, size in candidates]
            else:
                out.blobs += await self._decide(conn, [blob_id for blob_id, _ in candidates])
            if len(candidates) < BATCH:
                return

    @staticmethod
    async def _decide(conn: AsyncConnection, blob_ids: list[str]) -> list[tuple[str, int]]:
        """Collect those of blob_ids still unreferenced, under their row locks (an ingest holding
        one commits first, and its reference is then in the journal)."""
        async with journal_transaction(conn):
            cur = await conn.execute(
                "SELECT blob_id, org_id, storage_key, size_bytes FROM blobs WHERE blob_id = ANY(%s)"
                " AND collected_at IS NULL ORDER BY blob_id FOR UPDATE", (blob_ids,))
            locked = await cur.fetchall()
            cur = await conn.execute(
                "SELECT DISTINCT k FROM journal j, jsonb_object_keys(j.payload -> 'blobs') AS k"
                " WHERE j.kind = 'ingest.accepted' AND j.payload ? 'blobs' AND j.payload -> 'blobs' ?| %s",
                ([row[0] for row in locked],))
            referenced = {row[0] for row in await cur.fetchall()}
            now = utc_now()
            events = [NewEvent(org_id=org_id, subject_type="blob", subject_id=blob_id,
                               payload=ev.BlobCollected(blob_id=blob_id, storage_key=key, collected_at=now))
                      for blob_id, org_id, key, _ in locked if blob_id not in referenced]
            if events:
                await fold(conn, events)
                await append(conn, events)
        collected = [(blob_id, size) for blob_id, _, _, size in locked if blob_id not in referenced]
        for blob_id, size in collected:
            log.info("blob_collected", blob=blob_id, bytes=size)
        return collected

    @staticmethod
    async def _unconfirmed(conn: AsyncConnection, out: Collected, dry_run: bool) -> None:
        while True:
            async with conn.transaction():
                cur = await conn.execute(_UNCONFIRMED, (BATCH,))
                candidates = await cur.fetchall()
            if dry_run or not candidates:
                out.uploads += candidates
                return
            async with journal_transaction(conn):
                cur = await conn.execute(
                    "SELECT upload_id, org_id, received_size FROM uploads WHERE upload_id = ANY(%s)"
                    " AND state = 'verifying' AND expires_at < now() ORDER BY upload_id FOR UPDATE",
                    ([upload_id for upload_id, _ in candidates],))
                locked = await cur.fetchall()  # a confirm that held one first verified or failed it
                now = utc_now()
                events = [NewEvent(org_id=org_id, subject_type="upload", subject_id=upload_id,
                                   payload=ev.UploadFailed(upload_id=upload_id, error=UNCONFIRMED_ERROR,
                                                           failed_at=now))
                          for upload_id, org_id, _ in locked]
                if events:
                    await fold(conn, events)
                    await append(conn, events)
            for upload_id, _, size in locked:
                log.info("upload_expired_unconfirmed", upload=upload_id, bytes=size)
            out.uploads += [(upload_id, size) for upload_id, _, size in locked]
            if len(candidates) < BATCH:
                return

    async def _files(self, conn: AsyncConnection, out: Collected, dry_run: bool) -> None:
        assumed = {"blobs": [blob_id for blob_id, _ in out.blobs] if dry_run else [],
                   "uploads": [upload_id for upload_id, _ in out.uploads] if dry_run else []}
        async with conn.transaction():
            cur = await conn.execute(_ORPHAN_KEYS, assumed)
            keys = [row[0] for row in await cur.fetchall()]
        for key in keys:
            path = self.blob_root / key
            check_key(key)
            if not path.exists():
                continue  # deleted by an earlier pass
            if dry_run:
                out.files.append((key, _size(path)))
                continue
            async with conn.transaction():
                await hold_storage_key(conn, key)
                # Under the key's lock: a PUT of the same content that committed meanwhile holds it.
                cur = await conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM blobs WHERE storage_key = %s AND collected_at IS NULL)"
                    " OR EXISTS (SELECT 1 FROM uploads WHERE storage_key = %s AND state = 'verifying')",
                    (key, key))
                if (await cur.fetchone())[0]:
                    continue
                size = _size(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    continue
            log.info("blob_bytes_deleted", key=key, bytes=size)
            out.files.append((key, size))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class GarbageCollector(PeriodicWorker):
    """The `gc` worker: a collection at start, then every `gc.interval_seconds`; and, every
    STATISTICS_INTERVAL_SECONDS, an ANALYZE of the tables that grew and that autovacuum leaves
    alone, of the young ones among all that grew every YOUNG_INTERVAL_SECONDS, with a VACUUM of the
    queue tables full of dead rows (statistics.py)."""

    name = "gc"

    def __init__(self, collector: Collector, interval_seconds: float) -> None:
        super().__init__(interval_seconds)
        self.collector = collector
        self._statistics_due = 0.0  # monotonic time of the next look at every table: at once
        self._young_due = 0.0  # of the next look at the young ones

    async def open(self, conn: AsyncConnection) -> None:
        # One process of a deployment says it, once at start (and after a reconnection).
        await say_what_the_server_lacks(conn)

    async def step(self, conn: AsyncConnection) -> bool:
        now = time.monotonic()
        if now >= self._young_due:
            every_table = now >= self._statistics_due
            if vacuumed := await vacuum_queue_tables(conn):
                log.info("queue_tables_vacuumed", tables=vacuumed)
            if analyzed := await analyze_grown_tables(conn, young_only=not every_table):
                log.info("planner_statistics_refreshed", tables=analyzed)
            if every_table:
                self._statistics_due = now + STATISTICS_INTERVAL_SECONDS
            self._young_due = now + YOUNG_INTERVAL_SECONDS
        return await super().step(conn)

    @classmethod
    def from_settings(cls, settings: Settings) -> "GarbageCollector":
        return cls(Collector.from_settings(settings), settings.gc.interval_seconds)

    async def run_once(self, conn: AsyncConnection) -> None:
        done = await self.collector.collect(conn)
        if done.generations or done.blobs or done.uploads or done.files:
            log.info("gc_pass", generations=len(done.generations), blobs=len(done.blobs),
                     uploads=len(done.uploads), files=len(done.files), bytes_freed=done.bytes_freed)
