"""Vector projector: embeds current Versions with the engine's MiniLM space.

Input: record.accepted (embed each indexed segment: the Version's title
and the segment text), record.withdrawn (its vectors leave the index).
Output: rows of the `vectors` table and `record.enriched` events,
committed with the checkpoint in one Postgres transaction; then the
serving generation's hnswlib index in memory, snapshotted to disk.

Vectors are durable, the hnswlib index is a cache: a restart loads the
last snapshot and adds the vectors committed after it from Postgres,
without embedding anything again. A crash after the commit and before a
snapshot therefore loses nothing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from psycopg import AsyncConnection

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import PROGRESS_CHANNEL, append, read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.search import generations, vector_index
from contentsvc.search.lexical_index import segments_of
from contentsvc.search.vector_index import SPACE
from projectors.lexical import still_current
from projectors.runner import checkpoint_of

log = get_logger("contentsvc.projector.vectors")

KIND = "vectors"
SNAPSHOT_EVERY_SECONDS = 2.0


def embedding_inputs(manifest: dict) -> list[tuple[str, int, str]]:
    """(part_key, segment_start, text to embed) for each indexed segment of a Version."""
    title, segments = segments_of(manifest)
    return [(s.part_key, s.start, f"{title}\n{s.text}" if title else s.text) for s in segments]


class VectorProjector:
    name = KIND

    def __init__(self, home: Path) -> None:
        self.home = home
        self.generation: generations.Generation | None = None
        self.index = None
        self.labels: set[int] = set()
        self.position = 0
        self.max_label = 0
        self.last_snapshot = 0.0
        self._embedder = None

    @property
    def embedder(self):
        if self._embedder is None:
            from contentsvc.search.embedding import MiniLMEmbedder

            self._embedder = MiniLMEmbedder()
        return self._embedder

    def _directory(self) -> Path:
        return self.generation.path(self.home)

    async def _open_serving(self, conn: AsyncConnection) -> None:
        generation = await generations.serving_or_first(conn, KIND)
        if self.generation and generation.generation_id == self.generation.generation_id:
            return
        self.generation = generation
        async with conn.transaction():
            checkpoint = await checkpoint_of(conn, generation.checkpoint_name)
            snapshot = vector_index.read_snapshot(self._directory())
            after = snapshot.max_label if snapshot else 0
            cur = await conn.execute(
                "SELECT x.label, x.vector FROM vectors x JOIN records r ON r.record_id = x.record_id"
                " WHERE x.space = %s AND x.label > %s AND r.current_version_id = x.version_id AND NOT r.withdrawn"
                " ORDER BY x.label", (SPACE, after))
            rows = await cur.fetchall()
        if snapshot:
            self.index = vector_index.load(self._directory(), snapshot, extra=len(rows))
            self.labels = set(self.index.get_ids_list())
            self.max_label = snapshot.max_label
        else:
            self.index = vector_index.new_index(len(rows) + 1024)
            self.labels, self.max_label = set(), 0
        self._add([r[0] for r in rows], [vector_index.from_bytes(r[1]) for r in rows])
        self.position = checkpoint  # Postgres holds every vector up to its checkpoint
        log.info("vector_generation_open", generation=generation.generation_id, position=checkpoint,
                 vectors=len(self.labels), from_snapshot=bool(snapshot))

    def _add(self, labels: list[int], vectors: list[np.ndarray]) -> None:
        fresh = [(label, v) for label, v in zip(labels, vectors) if label not in self.labels]
        if not fresh:
            return
        vector_index.ensure_capacity(self.index, len(fresh))
        self.index.add_items(np.stack([v for _, v in fresh]), [label for label, _ in fresh])
        self.labels.update(label for label, _ in fresh)
        self.max_label = max(self.max_label, max(label for label, _ in fresh))

    def _remove(self, labels: list[int]) -> None:
        for label in labels:
            if label in self.labels:
                self.index.mark_deleted(label)
                self.labels.discard(label)

    async def step(self, conn: AsyncConnection, batch_size: int) -> int:
        await self._open_serving(conn)
        generation = self.generation
        async with conn.transaction():
            events = await read_after(conn, self.position, min(batch_size, 256))
        if not events:
            self._maybe_snapshot(force=True)  # idle: make the snapshot current
            return 0
        last = events[-1].position
        current = await self._in_vector_corpora(conn, still_current(events))
        touched = {e.payload["record_id"] for e in events if e.kind in (ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN)}
        keys, texts = [], []
        for e in current:
            for part_key, start, text in embedding_inputs(e.payload["manifest"]):
                keys.append((e, part_key, start))
                texts.append(text)
        vectors = await asyncio.to_thread(self.embedder.embed, texts) if texts else np.zeros((0, 384), "f4")

        async with journal_transaction(conn):
            if not await generations.hold_if_serving(conn, generation):
                self.generation = None
                return 0
            cur = await conn.execute(
                "SELECT label FROM vectors WHERE space = %s AND record_id = ANY(%s) AND NOT version_id = ANY(%s)",
                (SPACE, list(touched), [e.payload["version_id"] for e in current]))
            stale = [r[0] for r in await cur.fetchall()]
            if keys:
                await conn.execute(
                    "INSERT INTO vectors (space, version_id, part_key, segment_start, org_id, corpus_id, record_id,"
                    " vector) SELECT %s, * FROM unnest(%b::text[], %b::text[], %b::int[], %b::text[], %b::text[],"
                    " %b::text[], %b::bytea[]) ON CONFLICT DO NOTHING",
                    (SPACE, [k[0].payload["version_id"] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                     [k[0].org_id for k in keys], [k[0].payload["source"]["corpus_id"] for k in keys],
                     [k[0].payload["record_id"] for k in keys], [vector_index.to_bytes(v) for v in vectors]))
                cur = await conn.execute(
                    "SELECT label, vector FROM vectors WHERE space = %s AND version_id = ANY(%s)",
                    (SPACE, list({k[0].payload["version_id"] for k in keys})))
                added = await cur.fetchall()
            else:
                added = []
            await append(conn, [
                NewEvent(kind=ev.RECORD_ENRICHED, org_id=e.org_id, corpus_id=e.corpus_id, subject_type="record",
                         subject_id=e.payload["record_id"], version_id=e.payload["version_id"],
                         receipt_id=e.payload["receipt_id"],
                         payload={"record_id": e.payload["record_id"], "version_id": e.payload["version_id"],
                                  "space": SPACE})
                for e in current
            ])
            await conn.execute(
                "UPDATE projector_checkpoints SET position = greatest(position, %s), updated_at = now()"
                " WHERE name = %s", (last, generation.checkpoint_name))
            await conn.execute("SELECT pg_notify(%s, %s)", (PROGRESS_CHANNEL, KIND))
        self._remove(stale)
        self._add([r[0] for r in added], [vector_index.from_bytes(r[1]) for r in added])
        self.position = last
        self._maybe_snapshot(force=False)
        return len(events)

    @staticmethod
    async def _in_vector_corpora(conn: AsyncConnection, accepted: list[JournalEvent]) -> list[JournalEvent]:
        """Only Corpora built with the engine's space are embedded (part1 rule 16)."""
        if not accepted:
            return []
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT org_id, corpus_id FROM corpora WHERE vector_spaces ? %s AND corpus_id = ANY(%s)",
                (SPACE, list({e.payload["source"]["corpus_id"] for e in accepted})))
            with_space = {(r[0], r[1]) for r in await cur.fetchall()}
        return [e for e in accepted if (e.org_id, e.payload["source"]["corpus_id"]) in with_space]

    def _maybe_snapshot(self, force: bool) -> None:
        now = time.monotonic()
        if self.index is None or (not force and now - self.last_snapshot < SNAPSHOT_EVERY_SECONDS):
            return
        snapshot = vector_index.read_snapshot(self._directory())
        if snapshot and snapshot.position >= self.position:
            return
        vector_index.save(self._directory(), self.index, self.position, self.max_label)
        self.last_snapshot = now
