"""Which Version of a Record is current: it moves when the lexical projector can serve a newer one.

Part 1, "States and transitions": a Version still building reports `is_current`
false until it becomes current, and a newer text replacing a Version is a stop
condition (`retrieval_ready` with `is_current` false); the Diagnostic table: a
quarantined Version is never current. So the Record's previous Version stays
current, and searchable, until its successor can serve.

A Version becomes current with one journal fact: the lexical projector's
`record.availability_changed` `{state: retrieval_ready, is_current: true,
searchable: true}`, appended once the index commit holding the Version is
durable. The read model moves `records.current_version_id` on it (the change
feed and monitoring see the same event), and the Version it replaces gets a
currentness-only event (`is_current: false`) just before it. A Version
replaced before it could serve (a newer revision or a withdrawal later in the
same lexical batch) ends with `retrieval_ready`, not current, not searchable;
a Version of a Record withdrawn meanwhile likewise.

`lexical_currentness` holds, per Record, the Version last made current: the one
whose currentness a successor ends, and, while `retired` is false, a sign that
the index still holds older Versions' documents. They keep the previous text
findable until the read model shows the successor current; then the lexical
projector removes them (retirable, mark_retired).
"""

from __future__ import annotations

from psycopg import AsyncConnection

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import append, columns


def availability_event(e: JournalEvent, state: str, searchable: bool = False, is_current: bool = False) -> NewEvent:
    """The availability of the Version a record.accepted event `e` created."""
    return _availability(e, e.payload.version_id, state=state, searchable=searchable, is_current=is_current)


def _no_longer_current(e: JournalEvent, version_id: str) -> NewEvent:
    """Only currentness moved: `version_id` of e's Record stops being current."""
    return _availability(e, version_id, is_current=False)


def _availability(e: JournalEvent, version_id: str, **moved) -> NewEvent:
    p = e.payload
    return NewEvent(
        org_id=e.org_id,
        corpus_id=e.corpus_id,
        subject_type="record",
        subject_id=p.record_id,
        version_id=version_id,
        receipt_id=p.receipt_id,
        payload=ev.RecordAvailabilityChanged(record_id=p.record_id, version_id=version_id, **moved),
    )


def newest_servable(events: list[JournalEvent]) -> dict[str, JournalEvent | None]:
    """Per Record touched by `events`: its newest Version that can serve (record.accepted, not
    quarantined) at the end of the batch, or None once withdrawn. A quarantined Version
    changes nothing: the Record's text stays what it was."""
    latest: dict[str, JournalEvent | None] = {}
    for e in events:
        if e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined:
            latest[e.payload.record_id] = e
        elif e.kind == ev.RECORD_WITHDRAWN:
            latest[e.payload.record_id] = None
    return latest


def still_current(events: list[JournalEvent]) -> list[JournalEvent]:
    """record.accepted events whose Version is still its Record's newest servable one at the
    end of the batch (what the indexes hold for the Record)."""
    return [e for e in newest_servable(events).values() if e is not None]


def replaced(events: list[JournalEvent]) -> list[JournalEvent]:
    """record.accepted events of servable Versions replaced later in the batch (by a newer
    revision or a withdrawal): they never serve."""
    keep = {id(e) for e in still_current(events)}
    return [e for e in events if e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined and id(e) not in keep]


async def publish(conn: AsyncConnection, events: list[JournalEvent], then: list[NewEvent] | None = None) -> None:
    """Append the end of baseline processing for the Versions of `events`, now in the index,
    and then the events `then`, in one append (inside the caller's journal transaction: the
    lexical fold makes it its last statement)."""
    then = then or []
    ready, ended = still_current(events), replaced(events)
    if not ready and not ended:
        await append(conn, then)
        return
    previous = await _current_versions(conn, ready)  # before the journal lock: only this fold writes them
    # Each ready Version has two outcomes: current, or (its Record withdrawn meanwhile) ready and
    # never current. Withdrawals are decided by the materializer; which outcome holds is decided
    # on the server, under the journal lock, so no withdrawal can land between that decision and
    # these events.
    candidates: list[tuple[NewEvent, bool | None, JournalEvent]] = [
        (availability_event(e, "retrieval_ready"), None, e) for e in ended]
    for e in ready:
        candidates.append((availability_event(e, "retrieval_ready"), True, e))
        was = previous.get(e.payload.record_id)
        if was is not None and was != e.payload.version_id:
            candidates.append((_no_longer_current(e, was), False, e))
        candidates.append((availability_event(e, "retrieval_ready", searchable=True, is_current=True), False, e))
    unconditional = [None] * len(then)
    ids = _identities([e for _, _, e in candidates])
    # lexical_publish (schema/028) takes the journal lock and decides there: the lock is never
    # held while this process prepares the next statement.
    await conn.execute(_PUBLISH, ([e.payload.record_id for e in ready], [e.payload.version_id for e in ready],
                                  *_identities(ready), *columns([c for c, _, _ in candidates] + then),
                                  [w for _, w, _ in candidates] + unconditional,
                                  *(column + unconditional for column in ids[1:])))


def _identities(accepted: list[JournalEvent]) -> tuple[list[str], ...]:
    """The source identities (org, corpus, namespace, key) of record.accepted events, as arrays."""
    return ([e.org_id for e in accepted], [e.payload.source.corpus_id for e in accepted],
            [e.payload.source.namespace for e in accepted], [e.payload.source.record_key for e in accepted])


_PUBLISH = """SELECT lexical_publish(
    %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::text[], %b::text[], %b::bool[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
    %b::jsonb[],
    %b::bool[], %b::text[], %b::text[], %b::text[])"""  # the ready Versions; the candidates; their conditions


async def _current_versions(conn: AsyncConnection, accepted: list[JournalEvent]) -> dict[str, str]:
    """The Versions last made current of the Records of `accepted` (record_id -> version_id)."""
    if not accepted:
        return {}
    cur = await conn.execute("SELECT record_id, version_id FROM lexical_currentness WHERE record_id = ANY(%s)",
                             ([e.payload.record_id for e in accepted],))
    return {r[0]: r[1] for r in await cur.fetchall()}


async def retirable(conn: AsyncConnection, limit: int) -> list[tuple[str, str]]:
    """(record_id, current version_id) of Records whose older Versions may leave the index:
    the read model shows the current one (searches now hydrate it), or the Record withdrawn."""
    # Few rows wait to retire, in a table of every Record: the lateral subquery (LIMIT 1 keeps the
    # planner from flattening it) looks each one up by key. As a plain join, stale statistics made
    # it a merge join over all of `records`, whose cost grew with the corpus on every step.
    cur = await conn.execute(
        "SELECT c.record_id, c.version_id FROM lexical_currentness c CROSS JOIN LATERAL"
        " (SELECT 1 FROM records r WHERE r.record_id = c.record_id"
        "  AND (r.current_version_id = c.version_id OR r.withdrawn) LIMIT 1) AS shown"
        " WHERE NOT c.retired LIMIT %s", (limit,))
    return [(r[0], r[1]) for r in await cur.fetchall()]


async def mark_retired(conn: AsyncConnection, rows: list[tuple[str, str]]) -> None:
    """The index no longer holds older Versions of these Records (unless a newer one was
    made current meanwhile: that row stays to retire)."""
    await conn.execute(
        "UPDATE lexical_currentness c SET retired = true FROM unnest(%s::text[], %s::text[]) AS u(record_id, version_id)"
        " WHERE c.record_id = u.record_id AND c.version_id = u.version_id",
        ([r[0] for r in rows], [r[1] for r in rows]))
