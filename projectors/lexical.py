"""Lexical projector: folds Versions into the serving Tantivy generation.

Input: record.accepted (index the Record's newest servable Version, in
every live projection generation of its Corpus; a quarantined Version
changes nothing), record.withdrawn (remove the Record), operation.changed
(start, cancel or supersede a Corpus's projection generation:
projectors/projections.py). Output: the index files of the serving
generation, and events in the journal: `building_baseline` when a Version
is picked up, `retrieval_ready` only after the index commit holding it is
durable and visible to searchers (it then becomes current and searchable,
or, replaced meanwhile, ends there: projectors/currentness.py), and the
Operations' progress and outcomes. The Version a new one replaces keeps its
documents until the read model shows its successor current, so its text
stays findable until the new one can serve.

Order of a step, and why a crash anywhere is safe:
1. read events after the generation's checkpoint (Postgres);
2. announce `building_baseline` for new Versions, once (the generation's
   `announced` mark moves in the same transaction);
3. apply the batch to the index (behind the journal, the batches after it
   too) and commit it with the position it reflects (a checkpoint document
   inside the index);
4. for each batch, in one Postgres transaction: append `retrieval_ready`
   events (and the currentness they move, with `lexical_currentness`) and
   move the checkpoint;
5. after the fold, Versions whose successors the read model shows current
   leave the index (index commit first, then `retired` in Postgres: a crash
   between removes them again).
A crash between 3 and 4, or between two batches' transactions of 4,
re-applies what was not published yet to the index (delete, then add:
idempotent) and then publishes it once. After the fold, each building
projection generation is backfilled by one chunk, the same way: index
commit first, then its cursor and progress in Postgres. An index found behind its
Postgres checkpoint (files lost or restored) is refolded from its own
checkpoint without publishing again.
"""

from __future__ import annotations

import time
from pathlib import Path

from psycopg import AsyncConnection

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent
from contentsvc.journal.store import append
from contentsvc.logging import get_logger, safe_message
from contentsvc.projectors import currentness, projections
from contentsvc.projectors.base import GenerationFold, GenerationRetired, next_batch
from contentsvc.search import generations
from contentsvc.search import lexical_index
from contentsvc.search.lexical_index import LexicalWriter

log = get_logger("contentsvc.projector.lexical")

KIND = generations.LEXICAL
RETIRE_CHUNK = 500  # Records whose replaced Versions leave the index per step


def apply_to_index(writer: LexicalWriter, events: list[JournalEvent], live: projections.Live,
                   indexed: set[str] | None = None) -> None:
    """Fold record events into the index, each Record's newest servable Version into every live
    projection generation of its Corpus. A quarantined Version changes nothing.

    Live (`indexed` None): the Version it replaces keeps its documents (the serving text until
    the new one is current; _retire_replaced removes them), and Versions replaced within the
    batch are removed by id, so a batch folded again after a crash, or with more events, adds
    each Version once. A replay into a fresh index (`indexed`: the Records it already has)
    keeps only each Record's newest Version, and skips deletes for Records it has not seen."""
    if indexed is not None:
        for e in events:
            if e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined:
                p = e.payload
                if p.record_id in indexed:
                    writer.remove_record(p.record_id)
                indexed.add(p.record_id)
                _add(writer, live, e)
            elif e.kind == ev.RECORD_WITHDRAWN:
                writer.remove_record(e.payload.record_id)
        return
    for e in currentness.replaced(events) + currentness.still_current(events):
        writer.remove_version(e.payload.version_id)
    for record_id, e in currentness.newest_servable(events).items():
        if e is None:
            writer.remove_record(record_id)
        else:
            _add(writer, live, e)


def _versions(events: list[JournalEvent]) -> int:
    return sum(e.kind == ev.RECORD_ACCEPTED for e in events)


def _add(writer: LexicalWriter, live: projections.Live, e: JournalEvent) -> None:
    for projection in live.of(e.org_id, e.payload.source.corpus_id):
        writer.add_version(e.org_id, projection.projection_generation_id, projection.retrieval, e.payload)


class LexicalProjector(GenerationFold):
    name = KIND
    reads = frozenset({ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN, ev.CORPUS_CREATED, ev.OPERATION_CHANGED})
    rests_in_ingest_bursts = True  # on the way to searchable (runner.IngestBurst)
    # Its currentness decision appends under the journal lock (12.7 ms at the median with 1,000
    # positions under batch ingest), every other append waiting: half the usual step.
    batch_size = 500
    PURGE_EVERY_SECONDS = 1.0
    # Each step commits the Tantivy index (a new segment, fsynced): under a stream of single
    # ingests, 200 ms of gathering (Elasticsearch refreshes every second) cuts that work several-fold.
    coalesce_seconds = 0.2
    # Behind the journal, a step reads on and commits the index once for several batches: a
    # commit's fixed cost (a new segment, a dozen fields' dictionaries written, fsynced and
    # merged later: about 20 ms of CPU) was more than indexing the 80 or so single ingests a
    # batch of 500 positions holds (docs/decisions.md, "The lexical fold's index commits").
    GATHER_VERSIONS = 2000
    GATHER_SECONDS = 0.5

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.writer: LexicalWriter | None = None
        self.live = projections.Live()
        self.published = 0  # what availability events were published for (self.position: what the index holds)
        self.purged_at = 0.0

    async def open_generation(self, conn: AsyncConnection, generation: generations.Generation,
                              published: int) -> int:
        self._discard_writer()
        self.writer = LexicalWriter(generation.path(self.home))
        async with conn.transaction():
            self.live = await projections.load_live(conn)
        self.published = published
        position = min(self.writer.checkpoint(), published)
        log.info("lexical_generation_open", generation=generation.generation_id,
                 index_position=position, published=published, analyzer=self.writer.layout.analyzer)
        if self.writer.layout.outdated:
            log.warning("lexical_generation_outdated", generation=generation.generation_id,
                        analyzer=self.writer.layout.analyzer, current=lexical_index.CURRENT.analyzer,
                        segments_stored=self.writer.layout.stores_segments,
                        remedy="contentsvc projector replay lexical")
        return position

    def _discard_writer(self) -> None:
        """Close the writer a reopening replaces. One Tantivy killed (its files vanished under it:
        an io error in its thread) cannot wait for its merges and raises at every close; it is gone
        all the same, and the new writer finds the generation's files, or refolds what they lost.
        Raising here instead kept the fold from reopening at every retry of its fault."""
        writer, self.writer = self.writer, None
        if writer is None:
            return
        try:
            writer.close()
        except (ValueError, RuntimeError) as exc:  # what tantivy raises for a killed or consumed writer
            log.warning("lexical_writer_discarded", error=type(exc).__name__, message=safe_message(exc))

    async def fold(self, conn: AsyncConnection, events: list[JournalEvent], through: int) -> None:
        decisions, applied = await self._take(conn, events, through)
        batches = [(events, through, decisions)]
        if not decisions.started and not decisions.ended:
            applied = await self._gather(conn, batches) or applied
        if applied:
            self.writer.commit(batches[-1][1])
        for batch_events, batch_through, batch_decisions in batches:  # one transaction each, as read
            async with self.checkpointed(conn, batch_through):
                await projections.record(conn, batch_decisions)
                await currentness.publish(conn, [e for e in batch_events if e.position > self.published],
                                          then=batch_decisions.events())
            self.published = max(self.published, batch_through)

    async def _gather(self, conn: AsyncConnection, batches: list[tuple[list[JournalEvent], int,
                                                                         projections.Decisions]]) -> bool:
        """Behind the journal, the batches after the first join its index commit (up to
        GATHER_VERSIONS Versions, or GATHER_SECONDS); each is still published in a transaction of
        its own. A batch holding a Corpus or Operation event ends the gathering: the next step
        folds it. True when any batch was applied to the index."""
        started = time.monotonic()
        versions = _versions(batches[0][0])
        applied = False
        while self.journal_has_more and self.isolating_from is None and versions < self.GATHER_VERSIONS \
                and time.monotonic() - started < self.GATHER_SECONDS:
            last_events, last, last_decisions = batches[-1]
            async with conn.transaction():
                events, through, self.journal_has_more = await next_batch(conn, last, self.batch_size, self.reads)
            if through == last:
                break
            if self._undecided(events):
                self.journal_has_more = True  # the next step reads it again
                break
            if not events:  # positions holding no kind it reads: the last batch reaches further
                batches[-1] = (last_events, through, last_decisions)
                continue
            self.folding += tuple(events)
            decisions, batch_applied = await self._take(conn, events, through)
            batches.append((events, through, decisions))
            applied = applied or batch_applied
            versions += _versions(events)
        return applied

    def _undecided(self, events: list[JournalEvent]) -> list[JournalEvent]:
        """Corpus and Operation events not decided yet (decided before a restart: not again)."""
        return [e for e in events if e.position > self.published and e.kind in (ev.CORPUS_CREATED,
                                                                                 ev.OPERATION_CHANGED)]

    async def _take(self, conn: AsyncConnection, events: list[JournalEvent], through: int
                    ) -> tuple[projections.Decisions, bool]:
        """Announce the batch's new Versions, decide its Corpus and Operation events and apply it
        to the index (not committed); its decisions, and whether the index changed."""
        generation, writer = self.generation, self.writer
        async with conn.transaction():
            cur = await conn.execute("SELECT announced, state FROM search_generations WHERE generation_id = %s",
                                     (generation.generation_id,))
            announced, state = await cur.fetchone()
        if state != "serving":  # a cutover happened: serve the new one next step
            raise GenerationRetired(generation.generation_id)
        fresh = [e for e in events if e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined
                 and e.position > max(announced, self.published)]
        if fresh:
            # A generation retired meanwhile announces nothing (its successor will, once).
            async with self.holding_generation(conn):
                await conn.execute("UPDATE search_generations SET announced = %s WHERE generation_id = %s",
                                   (through, generation.generation_id))
                await append(conn, [currentness.availability_event(e, "building_baseline") for e in fresh])

        decisions = projections.Decisions()
        if undecided := self._undecided(events):
            async with conn.transaction():
                decisions = await projections.decide(conn, self.live, undecided)
        if decisions.started or decisions.ended or any(e.kind in (ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN)
                                                       for e in events):
            apply_to_index(writer, events, self.live)
            return decisions, True
        return decisions, False

    async def after_batch(self, conn: AsyncConnection, idle: bool) -> bool:
        pending = await self._retire_replaced(conn)
        pending = await self._backfill(conn) or pending
        if time.monotonic() - self.purged_at > self.PURGE_EVERY_SECONDS:
            await self._purge(conn)
        return pending

    async def _retire_replaced(self, conn: AsyncConnection) -> bool:
        """Replaced Versions leave the index once the read model shows their successor current
        (searches hydrate it from then on); True while more remain."""
        async with conn.transaction():
            rows = await currentness.retirable(conn, RETIRE_CHUNK)
        if not rows:
            return False
        replaced = self.writer.replaced_versions(dict(rows))
        for version_id in replaced:
            self.writer.remove_version(version_id)
        if replaced:
            self.writer.commit(self.position)
        async with conn.transaction():  # a crash before this retires them again: deletes are idempotent
            await currentness.mark_retired(conn, rows)
        return len(rows) == RETIRE_CHUNK

    async def _backfill(self, conn: AsyncConnection) -> bool:
        """One chunk for each building projection generation; True while any remains."""
        generation, writer = self.generation, self.writer
        pending = False
        for p in self.live.building():
            if p.backfill_index != generation.generation_id:  # a cursor holds only for the index it was made in
                p.backfill_index, p.backfill_cursor, p.versions_done = generation.generation_id, "", 0
            async with conn.transaction():
                rows = await projections.latest_record_events(conn, p, self.position)
            for record_id, kind, payload in rows:
                writer.remove_record_in(p.projection_generation_id, record_id)
                if kind == ev.RECORD_ACCEPTED and not payload.quarantined:
                    writer.add_version(p.org_id, p.projection_generation_id, p.retrieval, payload)
                    p.versions_done += 1
            if rows:
                p.backfill_cursor = rows[-1][0]
                writer.commit(self.position)
            finished = len(rows) < projections.backfill_chunk()
            async with self.holding_generation(conn):
                await projections.save_backfill(conn, p)
                if finished:
                    news = await projections.cut_over(conn, self.live, p)
                else:
                    news = [projections.operation_event(p, {"state": "running", **projections.counters(p)})]
                await append(conn, news)
            if finished:
                log.info("projection_generation_built", generation=p.projection_generation_id,
                         corpus=p.corpus_id, operation=p.operation_id, outcome=news[0].payload.operation.state)
            pending = pending or not finished
        return pending

    async def _purge(self, conn: AsyncConnection) -> None:
        """Documents of ended generations leave the index (retired ones after a grace period)."""
        self.purged_at = time.monotonic()
        async with conn.transaction():
            ended = await projections.purgeable(conn)
        if not ended:
            return
        for generation_id in ended:
            self.writer.remove_projection(generation_id)
        self.writer.commit(self.position)
        async with conn.transaction():
            await projections.mark_purged(conn, ended)
