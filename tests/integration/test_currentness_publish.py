"""The lexical fold's currentness decision against a withdrawal that lands while it publishes.

Part 1, "States and transitions": a withdrawn Record is never made current again, and a
Version replaced before it could serve ends `retrieval_ready`, not current. The lexical fold
reads what it can before the journal lock and lets the server decide, under the lock, which
of a Version's two outcomes holds (projectors/currentness.py). Here a withdrawal commits while
the publish waits for that lock: the decision must see it.
"""

import asyncio

import msgspec
import psycopg

from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent
from contentsvc.journal.store import head, hold_journal_lock, read_after, transaction
from contentsvc.projectors import currentness

ORG = "org_currentness"
CORPUS = "cor_currentness"


def _accepted(position: int, key: str, record_id: str) -> JournalEvent:
    version_id, receipt_id = new_id("ver"), new_id("rcp")
    payload = ev.RecordAccepted(
        record_id=record_id, version_id=version_id, receipt_id=receipt_id,
        source=ev.Source(corpus_id=CORPUS, namespace="ns", record_key=key), manifest={}, provenance={},
        accepted_at="2026-11-25T00:00:00Z", created_at="2026-11-25T00:00:00Z")
    return JournalEvent(position=position, event_id=new_id("evt"), kind=ev.RECORD_ACCEPTED, public=True,
                        org_id=ORG, corpus_id=CORPUS, subject_type="record", subject_id=record_id,
                        version_id=version_id, receipt_id=receipt_id, payload=payload, committed_at=None)


async def _identity(conn: psycopg.AsyncConnection, key: str, record_id: str, withdrawn: bool) -> None:
    await conn.execute(
        "INSERT INTO materializer_identities (org_id, corpus_id, namespace, record_key, record_id, withdrawn)"
        " VALUES (%s, %s, 'ns', %s, %s, %s) ON CONFLICT (org_id, corpus_id, namespace, record_key)"
        " DO UPDATE SET withdrawn = EXCLUDED.withdrawn", (ORG, CORPUS, key, record_id, withdrawn))


async def _scenario(url: str) -> None:
    kept, withdrawn, replaced = new_id("rec"), new_id("rec"), new_id("rec")
    older_version = new_id("ver")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as setup:
        for key, record_id in (("kept", kept), ("withdrawn", withdrawn), ("replaced", replaced)):
            await _identity(setup, key, record_id, withdrawn=False)
        # `kept` had a current Version before: it stops being current when the new one starts.
        await setup.execute("INSERT INTO lexical_currentness (record_id, version_id, retired) VALUES (%s, %s, true)",
                            (kept, older_version))
        start = await head(setup)

    first_of_replaced = _accepted(1, "replaced", replaced)
    batch = [first_of_replaced, _accepted(2, "kept", kept), _accepted(3, "withdrawn", withdrawn),
             _accepted(4, "replaced", replaced)]

    async with await psycopg.AsyncConnection.connect(url) as holder, \
            await psycopg.AsyncConnection.connect(url) as fold:
        await holder.execute("BEGIN")
        await hold_journal_lock(holder)  # as the materializer holds it while it withdraws

        async def publish() -> None:
            async with transaction(fold):
                await currentness.publish(fold, batch)

        publishing = asyncio.create_task(publish())
        await asyncio.sleep(0.5)
        assert not publishing.done(), "the publish must wait for the journal lock"
        await _identity(holder, "withdrawn", withdrawn, withdrawn=True)
        await holder.commit()
        await asyncio.wait_for(publishing, 10)

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as check:
        appended = [e for e in await read_after(check, start, 100) if e.org_id == ORG]
        cur = await check.execute("SELECT record_id, version_id, retired FROM lexical_currentness"
                                  " WHERE record_id = ANY(%s)", ([kept, withdrawn, replaced],))
        currentness_rows = {r[0]: (r[1], r[2]) for r in await cur.fetchall()}

    outcome = [(e.payload.record_id, e.payload.version_id, e.payload.state, e.payload.is_current,
                e.payload.searchable) for e in appended]
    kept_version, withdrawn_version, replaced_version = (batch[1].payload.version_id, batch[2].payload.version_id,
                                                         batch[3].payload.version_id)
    assert outcome == [
        # replaced later in the same batch: ready, never current (part 1, States and transitions)
        (replaced, first_of_replaced.payload.version_id, "retrieval_ready", False, False),
        (replaced, replaced_version, "retrieval_ready", True, True),
        (kept, older_version, msgspec.UNSET, False, msgspec.UNSET),  # only currentness moved
        (kept, kept_version, "retrieval_ready", True, True),
        # withdrawn while the publish waited for the lock: ready, not current, not searchable
        (withdrawn, withdrawn_version, "retrieval_ready", False, False),
    ]
    assert currentness_rows == {kept: (kept_version, False), replaced: (replaced_version, False)}


def test_a_withdrawal_committed_while_publish_waits_for_the_lock_is_seen(databases):
    # part 1 "States and transitions": a withdrawn Record's Version never becomes current
    asyncio.run(_scenario(databases.create()))


async def _withdrawn_in_the_batch(url: str) -> None:
    record_id = new_id("rec")
    accepted = _accepted(1, "gone", record_id)
    withdrawal = JournalEvent(
        position=2, event_id=new_id("evt"), kind=ev.RECORD_WITHDRAWN, public=True, org_id=ORG, corpus_id=CORPUS,
        subject_type="record", subject_id=record_id, version_id=None, receipt_id=None, committed_at=None,
        payload=ev.RecordWithdrawn(record_id=record_id, source=accepted.payload.source,
                                   withdrawn_at="2026-11-25T00:00:00Z"))
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        start = await head(conn)
        async with transaction(conn):
            await currentness.publish(conn, [accepted, withdrawal])
        appended = [(e.payload.version_id, e.payload.state, e.payload.is_current)
                    for e in await read_after(conn, start, 10)]
        cur = await conn.execute("SELECT count(*) FROM lexical_currentness WHERE record_id = %s", (record_id,))
        assert (await cur.fetchone())[0] == 0
    assert appended == [(accepted.payload.version_id, "retrieval_ready", False)]


def test_a_version_withdrawn_later_in_its_batch_ends_ready_and_never_current(databases):
    # part 1 "States and transitions": replaced before it could serve, it ends retrieval_ready
    asyncio.run(_withdrawn_in_the_batch(databases.create()))
