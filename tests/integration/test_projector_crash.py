"""Projectors survive kill -9 at any moment (issue: crash test; design.md projectors).

2,000 Records are ingested over HTTP while the materializer and the
read-model projector are killed with SIGKILL again and again and restarted.
Afterwards every Receipt resolved exactly once, and every read table equals
a fresh replay of the journal from position 0.
"""

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import psycopg

from contentsvc.auth import keys
from contentsvc.journal.store import read_after
from contentsvc.readmodel.fold import fold
from contentsvc.processes.local_service import free_port
from tests.conftest import wait_healthy

READ_TABLES = ("corpora", "receipts", "records", "versions")


def _spawn(args, url, log):
    return subprocess.Popen([sys.executable, "-m", "contentsvc.cli", *args],
                            env=dict(os.environ, CONTENTSVC_DATABASE_URL=url), stdout=log, stderr=subprocess.STDOUT)


async def _replay_into_scratch_schema(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with conn.transaction():
            await conn.execute("DROP SCHEMA IF EXISTS replay_check CASCADE")
            await conn.execute("CREATE SCHEMA replay_check")
            for table in READ_TABLES:
                await conn.execute(f"CREATE TABLE replay_check.{table} (LIKE public.{table} INCLUDING ALL)")
            await conn.execute("SET LOCAL search_path = replay_check, public")
            position = 0
            while events := await read_after(conn, position, 2000):
                await fold(conn, events)
                position = events[-1].position


def test_kill_minus_nine_loses_and_duplicates_nothing(databases, tmp_path):
    url = databases.create()
    log = open(tmp_path / "processes.log", "wb")
    port = free_port()
    api = _spawn(["serve", "--port", str(port), "--no-migrate"], url, log)
    projectors = {name: _spawn(["projector", "run", name], url, log) for name in ("materializer", "readmodel")}
    with psycopg.connect(url, autocommit=True) as conn:
        secret = keys.create_key(conn, "crash", keys.parse_actions("*"), None, None).secret
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {secret}"},
                          timeout=30)
    stop = threading.Event()
    kills = {"materializer": 0, "readmodel": 0}

    def killer():
        names = list(projectors)
        i = 0
        while not stop.wait(0.4):
            name = names[i % 2]
            i += 1
            projectors[name].send_signal(signal.SIGKILL)
            projectors[name].wait()
            kills[name] += 1
            projectors[name] = _spawn(["projector", "run", name], url, log)

    try:
        wait_healthy(f"http://127.0.0.1:{port}", api, tmp_path / "processes.log", 30)
        assert client.post("/v0/corpora", json={"idempotency_key": "c", "corpus_id": "crash", "name": "c"}
                           ).status_code == 201
        thread = threading.Thread(target=killer)
        thread.start()
        receipts = []
        run = uuid.uuid4().hex[:6]
        for b in range(19):  # 1,900 in batches, with corrections and withdrawals among them
            entries = [
                {"idempotency_key": f"{run}-{b}-{i}",
                 "source": {"corpus_id": "crash", "namespace": "n", "record_key": f"r{(b * 100 + i) % 1700}"},
                 "content": {"kind": "text", "text": f"text {b} {i}"}}
                for i in range(100)
            ]
            r = client.post("/v0/records/batch", json={"entries": entries})
            assert r.status_code == 200
            receipts += [item["receipt"]["receipt_id"] for item in r.json()["items"]]
        for i in range(100):  # and 100 single commands, a few of them withdrawals
            if i % 10 == 0:
                r = client.post("/v0/records/withdrawals", json={
                    "idempotency_key": f"{run}-w{i}", "source": {"corpus_id": "crash", "namespace": "n",
                                                                 "record_key": f"r{i}"}})
            else:
                r = client.post("/v0/records", json={
                    "idempotency_key": f"{run}-s{i}", "source": {"corpus_id": "crash", "namespace": "n",
                                                                 "record_key": f"s{i}"},
                    "content": {"kind": "text", "text": f"single {i}"}})
            assert r.status_code == 202
            receipts.append(r.json()["receipt_id"])
        # However fast the ingest went, each projector is killed at least twice (bounded wait).
        until = time.time() + 20
        while min(kills.values()) < 2 and time.time() < until:
            time.sleep(0.1)
        time.sleep(1.0)
        stop.set()
        thread.join()
        assert kills["materializer"] >= 2 and kills["readmodel"] >= 2

        # Let the restarted projectors catch up with the journal head.
        with psycopg.connect(url, autocommit=True) as conn:
            deadline = time.time() + 120
            while time.time() < deadline:
                head = conn.execute("SELECT max(position) FROM journal").fetchone()[0]
                behind = conn.execute("SELECT count(*) FROM projector_checkpoints WHERE position < %s",
                                      (head,)).fetchone()[0]
                pending = conn.execute("SELECT count(*) FROM receipts WHERE state = 'pending'").fetchone()[0]
                if behind == 0 and pending == 0:
                    break
                time.sleep(0.2)
            assert pending == 0 and behind == 0

            # Every Receipt resolved exactly once.
            counts = dict(conn.execute(
                "SELECT receipt_id, count(*) FROM journal WHERE kind = 'receipt.resolved' GROUP BY receipt_id"
            ).fetchall())
            assert len(receipts) == 2000
            assert all(counts.get(r) == 1 for r in receipts), "a receipt resolved zero or several times"
            assert len(counts) == 2000

        asyncio.run(_replay_into_scratch_schema(url))
        with psycopg.connect(url, autocommit=True) as conn:
            for table in READ_TABLES:
                for a, b in (("public", "replay_check"), ("replay_check", "public")):
                    extra = conn.execute(
                        f"SELECT count(*) FROM (SELECT * FROM {a}.{table} EXCEPT ALL SELECT * FROM {b}.{table}) d"
                    ).fetchone()[0]
                    assert extra == 0, f"{table}: {extra} rows in {a} not in {b}"
            assert conn.execute("SELECT count(*) FROM replay_check.receipts").fetchone()[0] == 2000
    finally:
        stop.set()
        for p in [api, *projectors.values()]:
            p.kill()
            p.wait()
        log.close()
