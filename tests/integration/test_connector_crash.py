"""A connector run survives kill -9 at any moment (decisions-part2 "Runs": each page's Receipts and
its checkpoint commit in one transaction, so a crash repeats a page but never skips one or makes a
Version twice).

The `connectors` worker runs as its own process beside `serve`, the materializer and the read
model, and is killed with SIGKILL again and again while a fixture Connector's 600 items come in
two at a time; it is restarted each time and runs are requested until the checkpoint reaches the
end. Afterwards every item has exactly one accepted ingest, one Receipt and one Version, and the
journal holds no acceptance twice."""

from __future__ import annotations

import random
import signal
import time
import uuid

import psycopg

from tests.conftest import create_corpus
from tests.integration.stack import Stack

ITEMS = 600
PAGE = 2
KILLS = 5


def offset(url: str, connector_id: str) -> int:
    with psycopg.connect(url) as conn:
        checkpoint = conn.execute("SELECT checkpoint FROM connectors WHERE connector_id = %s",
                                  (connector_id,)).fetchone()[0]
    return (checkpoint or {}).get("offset", 0)


def test_kill_minus_nine_of_the_connectors_worker_skips_and_duplicates_nothing(databases, tmp_path):
    url = databases.create()
    config = tmp_path / "contentsvc.toml"  # the floor defers a requested run to 1 s after the last start
    config.write_text("[connectors]\nfixture_enabled = true\ninterval_floor_seconds = 1\n")
    stack = Stack(url, tmp_path, ("materializer", "readmodel"), CONTENTSVC_CONFIG=str(config))
    worker = stack.spawn(["worker", "run", "connectors"])
    try:
        c = stack.client
        create_corpus(c, "crash")
        items = [{"record_key": f"item-{n:04d}", "revision": "1", "text": f"notice number {n}"} for n in range(ITEMS)]
        r = c.post("/v0/connectors", json={"idempotency_key": "c1", "corpus_id": "crash", "source_namespace": "fx",
                                           "kind": "fixture", "config": {"items": items, "page_size": PAGE}})
        assert r.status_code == 201, r.text
        connector_id = r.json()["connector_id"]
        rng = random.Random(7)
        kills, deadline = 0, time.time() + 120
        while offset(url, connector_id) < ITEMS:
            assert time.time() < deadline, stack.log_path.read_text()[-3000:]
            if kills < KILLS:
                time.sleep(rng.uniform(0.3, 0.8))
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                kills += 1
                worker = stack.spawn(["worker", "run", "connectors"])
            else:
                time.sleep(0.2)
            # A run ends after max_pages_per_run pages; ask for the next one (one queued at most).
            c.post(f"/v0/connectors/{connector_id}/runs", json={"idempotency_key": uuid.uuid4().hex})
        assert kills == KILLS

        with psycopg.connect(url) as conn:
            accepted = conn.execute(
                "SELECT count(*), count(DISTINCT payload->'source'->>'record_key') FROM journal"
                " WHERE kind = 'ingest.accepted' AND corpus_id = 'crash'").fetchone()
            assert accepted == (ITEMS, ITEMS)
            receipts = conn.execute("SELECT count(*), count(DISTINCT record_key) FROM receipts"
                                    " WHERE corpus_id = 'crash'").fetchone()
            assert receipts == (ITEMS, ITEMS)
            deadline = time.time() + 60
            while conn.execute("SELECT count(*) FROM versions WHERE corpus_id = 'crash'").fetchone()[0] < ITEMS:
                assert time.time() < deadline
                time.sleep(0.2)
                conn.commit()
            versions = conn.execute("SELECT count(*), count(DISTINCT record_id) FROM versions"
                                    " WHERE corpus_id = 'crash'").fetchone()
            assert versions == (ITEMS, ITEMS)
            runs = conn.execute("SELECT state, count(*) FROM connector_runs GROUP BY state").fetchall()
        assert dict(runs).get("failed", 0) == 0, runs
    finally:
        worker.kill()
        worker.wait()
        stack.close()
