"""How a Version's availability folds into the read model (part 1, Version availability states)."""

from __future__ import annotations

import asyncio
import uuid

import psycopg

from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.readmodel.fold import fold


def _moved(version_id: str, state: str, searchable: bool) -> NewEvent:
    return NewEvent(org_id="org_avail", corpus_id="c", subject_type="record", subject_id="rec_avail",
                    version_id=version_id,
                    payload=ev.RecordAvailabilityChanged(record_id="rec_avail", version_id=version_id,
                                                         is_current=False, state=state, searchable=searchable))


def test_a_move_to_the_state_a_version_has_rewrites_nothing_and_quarantine_sticks(database_url):
    async def run() -> list[tuple]:
        version_id = f"ver_{uuid.uuid4().hex}"
        seen = []
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            # As the read model inserts a Version from record.accepted: `materialized`, not searchable.
            await c.execute(
                "INSERT INTO versions (version_id, record_id, org_id, corpus_id, receipt_id, manifest, provenance,"
                " relations, diagnostics, availability_state, searchable, accepted_at, created_at)"
                " VALUES (%s, 'rec_avail', 'org_avail', 'c', 'rcp_avail', '{}', '{}', '[]', '[]', 'materialized',"
                " false, now(), now())", (version_id,))

            async def row() -> tuple:
                cur = await c.execute("SELECT ctid::text, availability_state, searchable FROM versions"
                                      " WHERE version_id = %s", (version_id,))
                return await cur.fetchone()

            seen.append(await row())
            for state, searchable in (("materialized", False), ("building_baseline", False),
                                      ("retrieval_ready", True), ("quarantined", False), ("retrieval_ready", True)):
                await fold(c, [_moved(version_id, state, searchable)])
                seen.append(await row())
        return seen

    inserted, same, baseline, ready, quarantined, after = asyncio.run(run())
    assert same == inserted  # the same tuple (ctid): no new row version written for a move to where it is
    assert baseline[1:] == ("building_baseline", False) and baseline[0] != inserted[0]
    assert ready[1:] == ("retrieval_ready", True)
    assert quarantined[1:] == ("quarantined", False)
    assert after == quarantined  # part 1: a quarantined Version is never made available again
