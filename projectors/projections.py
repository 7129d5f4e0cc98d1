"""Corpus projection generations inside the lexical index: which are live, and
the Operations that build and activate them.

A Corpus always has one serving generation (routed to by search) and,
while a rebuild or a retrieval configuration runs, building ones. The
lexical projector folds every record event into all live generations of
its Corpus, each with its own configuration; a building generation is
also backfilled, Record by Record, with each Record's latest state as of
the index position; when the backfill is through, the generation holds
exactly what the serving one would and cuts over (domain/operations:
cutover_verdict). Searchers read the routed generation from the read
model, so they see the old generation or the new one, never neither:
the old one's documents are purged only after a grace period.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from msgspec import UNSET
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.config import current_settings
from contentsvc.domain import operations as ops
from contentsvc.journal import events as ev
from contentsvc.journal.codec import decode_payload, fetch_payloads_raw
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.search.engine_space import SPACE, engine_vectors_enabled


def backfill_chunk() -> int:
    """Records per backfill step: progress is reported after each, and the live fold runs between two."""
    return current_settings().search.backfill_chunk


_COLUMNS = ("projection_generation_id, org_id, corpus_id, retrieval, vector_spaces, state, operation_id,"
            " operation_kind, accepted_position, config_position, backfill_index, backfill_cursor,"
            " versions_in_scope, versions_done")


@dataclass
class Projection:
    projection_generation_id: str
    org_id: str
    corpus_id: str
    retrieval: dict
    vector_spaces: list
    state: str
    operation_id: str | None
    operation_kind: str | None
    accepted_position: int
    config_position: int
    backfill_index: str | None = None
    backfill_cursor: str = ""
    versions_in_scope: int = 0
    versions_done: int = 0

    @property
    def build(self) -> ops.Build:
        return ops.Build(self.operation_kind, self.accepted_position, self.config_position)


@dataclass
class Live:
    """The live (serving and building) generations, by Corpus."""

    by_corpus: dict[tuple[str, str], list[Projection]] = field(default_factory=dict)

    def of(self, org_id: str, corpus_id: str) -> list[Projection]:
        return self.by_corpus.get((org_id, corpus_id), [])

    def add(self, p: Projection) -> None:
        self.by_corpus.setdefault((p.org_id, p.corpus_id), []).append(p)

    def drop(self, generation_id: str) -> None:
        for key, items in self.by_corpus.items():
            self.by_corpus[key] = [p for p in items if p.projection_generation_id != generation_id]

    def find(self, operation_id: str) -> Projection | None:
        return next((p for items in self.by_corpus.values() for p in items if p.operation_id == operation_id), None)

    def building(self) -> list[Projection]:
        out = [p for items in self.by_corpus.values() for p in items if p.state == "building"]
        return sorted(out, key=lambda p: p.accepted_position)

    def serving(self, org_id: str, corpus_id: str) -> Projection | None:
        return next((p for p in self.of(org_id, corpus_id) if p.state == "serving"), None)


async def load_live(conn: AsyncConnection) -> Live:
    cur = await conn.execute(f"SELECT {_COLUMNS} FROM corpus_projections WHERE state IN ('serving', 'building')")
    live = Live()
    for row in await cur.fetchall():
        live.add(Projection(*row))
    return live


def operation_event(p: Projection, moved: dict[str, Any]) -> NewEvent:
    return ops.changed(p.org_id, p.corpus_id, p.operation_id, moved)


def counters(p: Projection) -> dict[str, Any]:
    done = min(p.versions_done, p.versions_in_scope)
    out: dict[str, Any] = {"counters": {"versions_in_scope": p.versions_in_scope, "versions_done": done}}
    out["progress"] = round(done / p.versions_in_scope, 4) if p.versions_in_scope else 0.0
    return out


@dataclass
class Decisions:
    """What a batch's Operation events decided: applied to the index first, then
    written to Postgres with the checkpoint (re-deciding after a crash gives the same)."""

    started: list[Projection] = field(default_factory=list)
    ended: list[tuple[Projection, str, dict]] = field(default_factory=list)  # (generation, state, event members)

    def events(self) -> list[NewEvent]:
        out = [operation_event(p, {"state": "running", **counters(p)}) for p in self.started]
        return out + [operation_event(p, moved) for p, _, moved in self.ended]


async def decide(conn: AsyncConnection, live: Live, events: list[JournalEvent]) -> Decisions:
    """Start a generation for each accepted Operation; end those canceled or superseded;
    know the first generation of each new Corpus. Mutates `live`, so that the batch's
    record events fold into the right generations."""
    d = Decisions()
    for e in events:
        if e.kind == ev.CORPUS_CREATED and not live.of(e.org_id, e.corpus_id):
            c = e.payload  # its first generation's row was written with the Corpus
            live.add(Projection(c.projection_generation_id, e.org_id, e.corpus_id, c.retrieval,
                                c.vector_spaces, "serving", None, None, 0, 0))
        if e.kind != ev.OPERATION_CHANGED:
            continue
        operation = e.payload.operation
        if operation.state == "cancel_requested":
            target = live.find(operation.operation_id)
            if target is not None and target.state == "building":
                live.drop(target.projection_generation_id)
                d.ended.append((target, "canceled", {"state": "canceled"}))
            continue
        request = e.payload.request
        if request is UNSET:  # a progress or outcome report
            continue
        serving = live.serving(e.org_id, e.corpus_id)
        if serving is None:  # the Corpus is unknown here (cannot happen: it was created earlier)
            continue
        if live.find(operation.operation_id) is not None:
            continue
        if request.kind == ops.RETRIEVAL_CONFIGURATION:
            # A newer accepted configuration supersedes the pending ones (a rebuild pinned to an
            # older configuration fails only if the newer one activates first: cutover_verdict).
            for older in [p for p in live.of(e.org_id, e.corpus_id) if p.state == "building"
                          and p.operation_kind == ops.RETRIEVAL_CONFIGURATION and p.config_position < e.position]:
                live.drop(older.projection_generation_id)
                d.ended.append((older, "failed", {"state": "failed",
                                                  "errors": [ops.error(ops.CONFIGURATION_SUPERSEDED)]}))
            retrieval, config_position = request.retrieval, e.position
        else:  # a rebuild is pinned to the configuration in effect when it was accepted
            retrieval, config_position = serving.retrieval, serving.config_position
        # A generation has the spaces its Corpus was built with, and a rebuild adds those enabled since
        # (part 1 rule 16; the vectors projector then embeds the Corpus once the rebuild serves).
        spaces = sorted(set(serving.vector_spaces) | ({SPACE} if request.kind == ops.PROJECTION_REBUILD
                                                      and engine_vectors_enabled() else set()))
        cur = await conn.execute("SELECT count(*) FROM records WHERE org_id = %s AND corpus_id = %s AND NOT withdrawn",
                                 (e.org_id, e.corpus_id))
        p = Projection(
            projection_generation_id=ops.projection_generation_for(operation.operation_id),
            org_id=e.org_id, corpus_id=e.corpus_id, retrieval=retrieval,
            vector_spaces=spaces, state="building", operation_id=operation.operation_id,
            operation_kind=request.kind, accepted_position=e.position, config_position=config_position,
            versions_in_scope=(await cur.fetchone())[0],
        )
        live.add(p)
        d.started.append(p)
    return d


async def record(conn: AsyncConnection, d: Decisions) -> None:
    """Write the decisions (inside the projector's checkpoint transaction)."""
    for p in d.started:
        await conn.execute(
            f"INSERT INTO corpus_projections ({_COLUMNS}) VALUES ({', '.join(['%s'] * 14)}) ON CONFLICT DO NOTHING",
            (p.projection_generation_id, p.org_id, p.corpus_id, Jsonb(p.retrieval), Jsonb(p.vector_spaces),
             p.state, p.operation_id, p.operation_kind, p.accepted_position, p.config_position, p.backfill_index,
             p.backfill_cursor, p.versions_in_scope, p.versions_done))
    for p, state, _ in d.ended:
        await conn.execute("UPDATE corpus_projections SET state = %s, ended_at = now()"
                           " WHERE projection_generation_id = %s AND state = 'building'",
                           (state, p.projection_generation_id))


async def latest_record_events(conn: AsyncConnection, p: Projection, through: int
                               ) -> list[tuple[str, str, ev.RecordAccepted | ev.RecordWithdrawn]]:
    """The next chunk of the Corpus's Records after the cursor: each one's latest
    record event at or before `through`, as (record_id, kind, payload)."""
    cur = conn.cursor()
    fetch_payloads_raw(cur)
    await cur.execute(
        "SELECT DISTINCT ON (subject_id) subject_id, kind, payload FROM journal"
        " WHERE org_id = %s AND corpus_id = %s AND subject_id > %s AND position <= %s"
        " AND kind IN ('record.accepted', 'record.withdrawn')"
        # A quarantined Version never serves: the Record's text stays the one before it.
        " AND NOT (kind = 'record.accepted' AND coalesce((payload->>'quarantined')::boolean, false))"
        " ORDER BY subject_id, position DESC LIMIT %s",
        (p.org_id, p.corpus_id, p.backfill_cursor, through, backfill_chunk()))
    return [(record_id, kind, decode_payload(kind, payload)) for record_id, kind, payload in await cur.fetchall()]


async def save_backfill(conn: AsyncConnection, p: Projection) -> None:
    await conn.execute(
        "UPDATE corpus_projections SET backfill_index = %s, backfill_cursor = %s, versions_done = %s"
        " WHERE projection_generation_id = %s AND state = 'building'",
        (p.backfill_index, p.backfill_cursor, p.versions_done, p.projection_generation_id))


async def cut_over(conn: AsyncConnection, live: Live, p: Projection) -> list[NewEvent]:
    """The backfill is through: activate p, or fail it by the activation rules."""
    serving = live.serving(p.org_id, p.corpus_id)
    verdict = ops.cutover_verdict(p.build, serving.build)
    done = replace(p, versions_done=p.versions_in_scope)
    live.drop(p.projection_generation_id)
    if verdict is not None:
        await conn.execute("UPDATE corpus_projections SET state = 'failed', ended_at = now()"
                           " WHERE projection_generation_id = %s", (p.projection_generation_id,))
        return [operation_event(p, {"state": "failed", "errors": [ops.error(verdict)]})]
    await conn.execute("UPDATE corpus_projections SET state = 'retired', ended_at = now()"
                       " WHERE projection_generation_id = %s", (serving.projection_generation_id,))
    await conn.execute("UPDATE corpus_projections SET state = 'serving', versions_done = versions_in_scope"
                       " WHERE projection_generation_id = %s", (p.projection_generation_id,))
    live.drop(serving.projection_generation_id)
    live.add(replace(done, state="serving"))
    return [
        operation_event(p, {"state": "succeeded", **counters(done),
                            "result": {"projection_generation_id": p.projection_generation_id}}),
        NewEvent(org_id=p.org_id, corpus_id=p.corpus_id, subject_type="corpus", subject_id=p.corpus_id,
                 payload=ev.CorpusRetrievalChanged(corpus_id=p.corpus_id, retrieval=p.retrieval,
                                                   vector_spaces=p.vector_spaces,
                                                   projection_generation_id=p.projection_generation_id)),
    ]


async def purgeable(conn: AsyncConnection) -> list[str]:
    """Generations whose documents can leave the index: failed and canceled ones at
    once, retired ones after the grace period and once the read model no longer routes
    searches to them (it may lag behind the cutover)."""
    cur = await conn.execute(
        "SELECT projection_generation_id FROM corpus_projections p WHERE NOT purged AND"
        " (state IN ('failed', 'canceled') OR (state = 'retired' AND ended_at < now() - make_interval(secs => %s)"
        "  AND NOT EXISTS (SELECT 1 FROM corpora c WHERE c.projection_generation_id = p.projection_generation_id)))",
        (current_settings().search.retired_grace_seconds,))  # a search on the old routing ends well within it
    return [r[0] for r in await cur.fetchall()]


async def mark_purged(conn: AsyncConnection, generation_ids: list[str]) -> None:
    await conn.execute("UPDATE corpus_projections SET purged = true WHERE projection_generation_id = ANY(%s)",
                       (generation_ids,))
