"""Vector projector: embeds current Versions with the engine's MiniLM space.

Input: record.accepted (embed each indexed segment: the Version's title
and the segment text) in a Corpus whose serving generation has the space,
record.withdrawn (its vectors leave the index), corpus.retrieval_changed
(a rebuild added the space: the Corpus's current Versions are embedded, a
chunk per step).
Output: rows of the `vectors` table and `record.enriched` events,
committed with the checkpoint in one Postgres transaction; then the
serving generation's hnswlib index in memory, snapshotted to disk.

Vectors are durable, the hnswlib index is a cache: a restart loads the
last snapshot and adds the vectors committed after it from Postgres,
without embedding anything again. A crash after the commit and before a
snapshot therefore loses nothing.

Without the embedding model (package not installed, or `search.model_dir`
naming a directory without it) the projector logs the fix once
(`vectors_waiting_for_model`), never exits for it, and keeps
folding without embedding: each Corpus with Versions to embed is listed in
`vector_backfills`, and each such Version gets `record.enrichment_blocked`,
so its processing reads `blocked` with the diagnostic. A restart with the
model works through `vector_backfills` as after a rebuild, and
`record.enriched` ends the block.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from contentsvc.projectors.base import GenerationFold
from contentsvc.projectors.currentness import still_current
from psycopg import AsyncConnection

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import append, head
from contentsvc.logging import get_logger
from contentsvc.readmodel import vectors as current_vectors
from contentsvc.readmodel.changes import head_position
from contentsvc.search import generations, vector_index
from contentsvc.search.embedding import INSTALL_HINT, EmbeddingModelMissing
from contentsvc.search.lexical_index import segments_of
from contentsvc.search.engine_space import SPACE

log = get_logger("contentsvc.projector.vectors")

KIND = generations.VECTORS
SNAPSHOT_EVERY_SECONDS = 2.0


def embedding_inputs(manifest: dict) -> list[tuple[str, int, str]]:
    """(part_key, segment_start, text to embed) for each indexed segment of a Version."""
    title, segments = segments_of(manifest)
    return [(s.part_key, s.start, f"{title}\n{s.text}" if title else s.text) for s in segments]


def _corpus(e: JournalEvent) -> tuple[str, str]:
    """The (org, Corpus) of a record.accepted event."""
    return e.org_id, e.payload.source.corpus_id


TEXTS_PER_STEP = 16  # about 0.4 s of embedding on two cores (256-token texts); see _within_step
BACKFILL_CHUNK = 16  # Versions embedded per step when a Corpus gains the space
BLOCKED_CHUNK = 500  # Versions reported blocked per step while the model is missing

MODEL_MISSING = "embedding_model_missing"


def model_missing_diagnostic() -> dict:
    """The part 1 Diagnostic of a Version whose vectors wait for the model: an operator installs it.
    Not retryable: processing the same input again cannot succeed until then."""
    return {"code": MODEL_MISSING, "retryable": False,
            "message": f"Vector space {SPACE} cannot embed: its embedding model is not installed on the server. "
                       f"The operator installs it ({INSTALL_HINT}) and restarts the vectors projector."}


@dataclass(frozen=True)
class Embeddable:
    """A current Version to embed, from a record.accepted event or from the read model."""

    org_id: str
    corpus_id: str
    record_id: str
    version_id: str
    receipt_id: str | None
    manifest: dict

    @classmethod
    def of(cls, e: JournalEvent) -> "Embeddable":
        p = e.payload
        return cls(e.org_id, p.source.corpus_id, p.record_id, p.version_id, p.receipt_id, p.manifest)


class VectorProjector(GenerationFold):
    name = KIND
    reads = frozenset({ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN, ev.CORPUS_RETRIEVAL_CHANGED})
    # Enrichment, off the path to searchable: steps bounded by their texts (_within_step), and
    # five steps nicer than the other folds, so that indexing gets the cores before embedding
    # does (at equal priority, embedding took 0.7 of the two cores under single ingests).
    coalesce_seconds = 0.2
    niceness_above_background = 5
    rests_in_ingest_bursts = True
    lags_by_design = True  # `record.enriched` says when it has caught up; no 429 waits for it
    batch_size = 256  # positions; a step embeds at most TEXTS_PER_STEP texts of them

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.index = None
        self.labels: set[int] = set()
        self.max_label = 0
        self.last_snapshot = 0.0
        self._embedder = None
        self.model_missing = False  # found missing once: then not looked for again until a restart
        self.tried: set[str] = set()  # Versions a backfill embedded (or found nothing to embed in)
        self.backfills = True  # whether vector_backfills may hold a row (checked once, then known)
        self.blocked_through = 0  # journal position of the last record.enrichment_blocked appended

    @property
    def embedder(self):
        if self._embedder is None:
            from contentsvc.search.embedding import MiniLMEmbedder

            self._embedder = MiniLMEmbedder()
        return self._embedder

    def model_ready(self) -> bool:
        """Whether the embedding model could be loaded; its absence is logged once, with the fix."""
        if self._embedder is None and not self.model_missing:
            try:
                self.embedder  # loads the model
            except EmbeddingModelMissing as exc:
                self.model_missing = True
                log.warning("vectors_waiting_for_model", space=SPACE, fix=INSTALL_HINT, problem=str(exc),
                            effect="Versions wait with processing blocked; restart the projector once installed")
        return not self.model_missing

    def _directory(self) -> Path:
        return self.generation.path(self.home)

    async def open(self, conn: AsyncConnection) -> None:
        await super().open(conn)
        # What a backfill tried may not have committed: try it again, as a restart would.
        self.tried.clear()
        self.backfills = True

    async def open_generation(self, conn: AsyncConnection, generation: generations.Generation,
                              published: int) -> int:
        snapshot = vector_index.read_snapshot(self._directory())
        after = snapshot.max_label if snapshot else 0
        async with conn.transaction():
            rows = await current_vectors.after_label(conn, SPACE, after)
            live = await current_vectors.labels_through(conn, SPACE, after)
        if snapshot:
            self.index = vector_index.load(self._directory(), snapshot, extra=len(rows))
            # The snapshot may hold vectors of Versions replaced or withdrawn after it was taken
            # (and hnswlib lists deleted labels too): only the current ones stay live.
            self.labels = set(self.index.get_ids_list())
            self._remove(list(self.labels - live))
            self.max_label = snapshot.max_label
        else:
            self.index = vector_index.new_index(len(rows) + 1024)
            self.labels, self.max_label = set(), 0
        self._add([r[0] for r in rows], [vector_index.from_bytes(r[1]) for r in rows])
        log.info("vector_generation_open", generation=generation.generation_id, position=published,
                 vectors=len(self.labels), from_snapshot=bool(snapshot))
        return published  # Postgres holds every vector up to the generation's checkpoint

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
                try:
                    self.index.mark_deleted(label)
                except RuntimeError:  # deleted before the snapshot was taken
                    pass
                self.labels.discard(label)

    async def after_batch(self, conn: AsyncConnection, idle: bool) -> bool:
        if self.backfills and await (self._report_blocked(conn) if self.model_missing else self._backfill(conn)):
            return True  # more to fill: come back at once
        if idle:
            self._maybe_snapshot(force=True)  # idle: make the snapshot current
        return False

    async def fold(self, conn: AsyncConnection, events: list[JournalEvent], through: int) -> None:
        with_space = await self._vector_corpora(conn, events)
        events, through = self._within_step(events, through, with_space)
        current = [Embeddable.of(e) for e in still_current(events) if _corpus(e) in with_space]
        # A quarantined Version changes nothing: the Record's vectors stay.
        touched = {e.payload.record_id for e in events if e.kind == ev.RECORD_WITHDRAWN
                   or (e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined)}
        gained = [e for e in events if e.kind == ev.CORPUS_RETRIEVAL_CHANGED and SPACE in e.payload.vector_spaces]
        parked = bool(current) and not self.model_ready()  # no model: fill these Corpora after a restart
        vectors = None if parked else await self._embed(current)

        async with self.checkpointed(conn, through):
            cur = await conn.execute(
                "SELECT label FROM vectors WHERE space = %s AND record_id = ANY(%s) AND NOT version_id = ANY(%s)",
                (SPACE, list(touched), [v.version_id for v in current]))
            stale = [r[0] for r in await cur.fetchall()]
            added = [] if parked else await self._store(conn, current, vectors)
            if parked:
                self.backfills = True
                await conn.execute(
                    "INSERT INTO vector_backfills (org_id, corpus_id, space, since)"
                    " SELECT o, c, %s, %s FROM unnest(%s::text[], %s::text[]) AS u(o, c)"
                    " ON CONFLICT (org_id, corpus_id, space) DO UPDATE SET"
                    " since = greatest(vector_backfills.since, EXCLUDED.since)",
                    (SPACE, through, *map(list, zip(*{(v.org_id, v.corpus_id) for v in current}))))
            for e in gained:  # the Corpus's earlier Versions get their vectors too
                self.backfills = True
                await conn.execute("INSERT INTO vector_backfills (org_id, corpus_id, space, since)"
                                   " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                   (e.org_id, e.corpus_id, SPACE, e.position))
        self._remove(stale)
        self._add([r[0] for r in added], [vector_index.from_bytes(r[1]) for r in added])
        self._maybe_snapshot(force=False)

    async def _embed(self, items: list[Embeddable]) -> tuple[list[tuple], np.ndarray]:
        keys, texts = [], []
        for item in items:
            for part_key, start, text in embedding_inputs(item.manifest):
                keys.append((item, part_key, start))
                texts.append(text)
        vectors = await asyncio.to_thread(self.embedder.embed, texts) if texts else np.zeros((0, 384), "f4")
        return keys, vectors

    @staticmethod
    async def _store(conn: AsyncConnection, items: list[Embeddable], embedded: tuple[list[tuple], np.ndarray]):
        """Insert the vectors and append record.enriched (inside the caller's transaction);
        returns the (label, vector) rows to add to the index."""
        keys, vectors = embedded
        added = []
        if keys:
            await conn.execute(
                "INSERT INTO vectors (space, version_id, part_key, segment_start, org_id, corpus_id, record_id,"
                " vector) SELECT %s, * FROM unnest(%b::text[], %b::text[], %b::int[], %b::text[], %b::text[],"
                " %b::text[], %b::bytea[]) ON CONFLICT DO NOTHING",
                (SPACE, [k[0].version_id for k in keys], [k[1] for k in keys], [k[2] for k in keys],
                 [k[0].org_id for k in keys], [k[0].corpus_id for k in keys], [k[0].record_id for k in keys],
                 [vector_index.to_bytes(v) for v in vectors]))
            cur = await conn.execute("SELECT label, vector FROM vectors WHERE space = %s AND version_id = ANY(%s)",
                                     (SPACE, list({k[0].version_id for k in keys})))
            added = await cur.fetchall()
        await append(conn, [
            NewEvent(org_id=v.org_id, corpus_id=v.corpus_id, subject_type="record",
                     subject_id=v.record_id, version_id=v.version_id, receipt_id=v.receipt_id,
                     payload=ev.RecordEnriched(record_id=v.record_id, version_id=v.version_id, space=SPACE))
            for v in items
        ])
        return added

    async def _backfill(self, conn: AsyncConnection) -> bool:
        """Embed one chunk of a Corpus that gained the space; True while work remains.

        The Versions come from the read model, once it has folded the change that added
        the space (every Version accepted before it is then there); later ones are
        embedded by the fold itself. A Version is embedded at most once: the `vectors`
        table, written only here, says which have been."""
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT b.org_id, b.corpus_id, b.since <= c.position FROM vector_backfills b"
                " JOIN projector_checkpoints c ON c.name = 'readmodel' WHERE b.space = %s LIMIT 1", (SPACE,))
            row = await cur.fetchone()
            if row is None:
                self.backfills = False  # until a change adds the space to a Corpus
                return False
            if not row[2]:
                return False
            org_id, corpus_id, _ = row
            cur = await conn.execute(
                "SELECT v.org_id, v.corpus_id, v.record_id, v.version_id, v.receipt_id, v.manifest"
                " FROM records r JOIN versions v ON v.version_id = r.latest_version_id"
                " WHERE r.org_id = %s AND r.corpus_id = %s AND NOT r.withdrawn"
                " AND v.availability_state <> 'quarantined' AND NOT v.version_id = ANY(%s)"
                " AND NOT EXISTS (SELECT 1 FROM vectors x WHERE x.space = %s AND x.version_id = v.version_id)"
                " LIMIT %s", (org_id, corpus_id, list(self.tried), SPACE, BACKFILL_CHUNK))
            items = [Embeddable(*r) for r in await cur.fetchall()]
        if items and not self.model_ready():
            return await self._report_blocked(conn)
        self.tried.update(v.version_id for v in items)  # a Version without text gets no vector: not again
        embedded = await self._embed(items)
        async with self.holding_generation(conn):
            added = await self._store(conn, items, embedded)
            if not items:
                await conn.execute("DELETE FROM vector_backfills WHERE org_id = %s AND corpus_id = %s AND space = %s",
                                   (org_id, corpus_id, SPACE))
                log.info("vector_backfill_done", corpus=corpus_id)
        self._add([r[0] for r in added], [vector_index.from_bytes(r[1]) for r in added])
        self._maybe_snapshot(force=False)
        return True

    async def _report_blocked(self, conn: AsyncConnection) -> bool:
        """Without the model: report each Version that waits for its vectors in a Corpus to fill
        as blocked, once (the read model then holds the diagnostic, and the query skips it); the
        rows of vector_backfills stay for a restart with the model. True while more wait."""
        async with conn.transaction():
            cur = await conn.execute("SELECT count(*) FROM vector_backfills WHERE space = %s", (SPACE,))
            if (await cur.fetchone())[0] == 0:
                self.backfills = False  # until a fold parks Versions or a change adds the space
                return False
            readmodel = await head_position(conn)  # the read model's checkpoint (0 before its first fold)
            if readmodel < self.blocked_through:
                return False  # what was reported is not folded yet: it would be reported again
            cur = await conn.execute(
                "SELECT v.org_id, v.corpus_id, v.record_id, v.version_id, v.receipt_id FROM vector_backfills b"
                " JOIN projector_checkpoints c ON c.name = 'readmodel' AND b.since <= c.position"
                " JOIN records r ON r.org_id = b.org_id AND r.corpus_id = b.corpus_id AND NOT r.withdrawn"
                " JOIN versions v ON v.version_id = r.current_version_id"
                " WHERE b.space = %s AND v.availability_state <> 'quarantined' AND NOT v.enriched"
                " AND v.enrichment_blocked IS NULL LIMIT %s", (SPACE, BLOCKED_CHUNK))
            waiting = await cur.fetchall()
        if waiting:
            diagnostic = model_missing_diagnostic()
            async with self.holding_generation(conn):
                await append(conn, [
                    NewEvent(org_id=org_id, corpus_id=corpus_id, subject_type="record", subject_id=record_id,
                             version_id=version_id, receipt_id=receipt_id,
                             payload=ev.RecordEnrichmentBlocked(record_id=record_id, version_id=version_id,
                                                                space=SPACE, diagnostic=diagnostic))
                    for org_id, corpus_id, record_id, version_id, receipt_id in waiting])
            async with conn.transaction():
                self.blocked_through = await head(conn)  # committed: at or past the events just appended
        return len(waiting) == BLOCKED_CHUNK

    @staticmethod
    async def _vector_corpora(conn: AsyncConnection, events: list[JournalEvent]) -> set[tuple[str, str]]:
        """The (org, Corpus) pairs among the events' Versions whose serving generation has the
        engine's space: only those are embedded (part1 rule 16)."""
        corpora = {e.payload.source.corpus_id for e in events if e.kind == ev.RECORD_ACCEPTED}
        if not corpora:
            return set()
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT org_id, corpus_id FROM corpus_projections WHERE state = 'serving' AND vector_spaces ? %s"
                " AND corpus_id = ANY(%s)", (SPACE, list(corpora)))
            return {(r[0], r[1]) for r in await cur.fetchall()}

    @staticmethod
    def _within_step(events: list[JournalEvent], through: int, with_space: set[tuple[str, str]]
                     ) -> tuple[list[JournalEvent], int]:
        """The events of one step, and the position it reaches: up to TEXTS_PER_STEP texts to
        embed, the rest for the next step. A step is never empty, so a Version with more texts
        than that is embedded in a step of its own. Embedding is the slow part,
        so a step is bounded by it rather than by positions alone: under a burst of ingests the
        fold rests after every step (runner.IngestBurst), and a step of a few hundred texts kept
        both cores for seconds at a time before its rest (3.1 of the API's 3.8 CPU-s in `bench
        ingest`'s single phase)."""
        texts = 0
        for i, e in enumerate(events):
            if e.kind != ev.RECORD_ACCEPTED or e.payload.quarantined or _corpus(e) not in with_space:
                continue
            texts += len(embedding_inputs(e.payload.manifest))
            if texts > TEXTS_PER_STEP and i:
                return events[:i], e.position - 1
        return events, through

    def _maybe_snapshot(self, force: bool) -> None:
        now = time.monotonic()
        if self.index is None or (not force and now - self.last_snapshot < SNAPSHOT_EVERY_SECONDS):
            return
        snapshot = vector_index.read_snapshot(self._directory())
        if snapshot and snapshot.position >= self.position:
            return
        vector_index.save(self._directory(), self.index, self.position, self.max_label)
        self.last_snapshot = now
