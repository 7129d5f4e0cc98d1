"""The collector against an ingest that references the same Blob at the same instant.

Both run for real (commands/records.py's accept_source_commands, projectors/gc.py's
Collector) on a real database; the test only holds the journal lock for a moment so
that one of them is caught between its row lock and its commit while the other
starts. Part 1 rule 7: a reference to a Blob is accepted only while the Blob is
verified, so the outcome is either "accepted, and the Blob kept" or "collected, and
the reference refused as unverified_blob", never a Version pointing at deleted bytes.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import psycopg
import pytest

from contentsvc.auth.principal import Principal
from contentsvc.commands.records import Accepted, accept_source_commands
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import IngestCommand
from contentsvc.journal.store import hold_journal_lock
from contentsvc.projectors.gc import Collector
from tests.conftest import ServerProcess, client_for, create_corpus, key_for
from tests.e2e.test_gc import UPLOAD_TTL, blob_file, wait_expired
from tests.e2e.test_uploads import blob_command, verified_blob


@pytest.fixture(scope="module")
def server(databases, tmp_path_factory):
    proc = ServerProcess(databases.create(), tmp_path_factory.mktemp("gc-races"),
                         extra_env={"CONTENTSVC_UPLOAD_URL_TTL": str(UPLOAD_TTL), "CONTENTSVC_GC_INTERVAL": "3600"})
    yield proc
    proc.stop()


def expired_blob(server: ServerProcess) -> tuple[str, str, str]:
    """A verified Blob of a fresh Organization, its upload expired: (org, corpus, blob_id)."""
    org = f"org-{uuid.uuid4().hex[:8]}"
    with client_for(server, key_for(server.database_url, org)) as client:
        corpus = create_corpus(client)
        blob = verified_blob(client, f"contended {uuid.uuid4().hex}".encode())
    wait_expired(blob)
    return org, corpus, blob["blob_id"]


async def _waiting_on_locks(url: str, count: int) -> None:
    """Until `count` other sessions of this database wait on a lock (bounded)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 10
        while True:
            cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                     " AND wait_event_type = 'Lock'")
            if (await cur.fetchone())[0] >= count:
                return
            assert time.monotonic() < deadline, "the contenders never met on the lock"
            await asyncio.sleep(0.02)


async def _ingest(url: str, org: str, corpus: str, blob_id: str):
    principal = Principal(key_id="k", org_id=org, actions=frozenset({"content:write", "blobs:read"}), corpora=None)
    command = msgspec.convert(blob_command(corpus, "contended", blob_id, "text/plain"), IngestCommand)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        [result] = await accept_source_commands(conn, principal, [command])
    return result


async def _collect(server: ServerProcess):
    async with await psycopg.AsyncConnection.connect(server.database_url, autocommit=True) as conn:
        return await Collector(server.home, server.home / "blobs", 600).collect(conn)


async def _race(server: ServerProcess, org: str, corpus: str, blob_id: str, ingest_first: bool):
    url = server.database_url
    async with await psycopg.AsyncConnection.connect(url) as gate:
        await hold_journal_lock(gate)  # whoever appends first waits here, its row lock held
        first = _ingest(url, org, corpus, blob_id) if ingest_first else _collect(server)
        first_task = asyncio.create_task(first)
        await _waiting_on_locks(url, 1)
        second_task = asyncio.create_task(_collect(server) if ingest_first else _ingest(url, org, corpus, blob_id))
        await _waiting_on_locks(url, 2)  # the second waits on the first's row lock
        await gate.rollback()
    results = await asyncio.gather(first_task, second_task)
    return results if ingest_first else results[::-1]  # (ingest result, collection)


def test_an_ingest_that_holds_the_blob_first_keeps_it(server):
    org, corpus, blob_id = expired_blob(server)
    path = blob_file(server, server.database_url, blob_id)
    ingested, collected = asyncio.run(_race(server, org, corpus, blob_id, ingest_first=True))
    assert isinstance(ingested, Accepted)
    assert blob_id not in [b for b, _ in collected.blobs]  # the collector saw the reference once it committed
    assert path.is_file()


def test_a_collection_decided_first_refuses_the_ingest(server):
    org, corpus, blob_id = expired_blob(server)
    path = blob_file(server, server.database_url, blob_id)
    ingested, collected = asyncio.run(_race(server, org, corpus, blob_id, ingest_first=False))
    assert blob_id in [b for b, _ in collected.blobs]
    assert isinstance(ingested, ApiError) and ingested.code == "unverified_blob"
    assert not path.exists()
    with psycopg.connect(server.database_url) as conn:  # no ingest names it in the journal
        assert conn.execute("SELECT count(*) FROM journal WHERE kind = 'ingest.accepted'"
                            " AND payload -> 'blobs' ? %s", (blob_id,)).fetchone()[0] == 0
