"""What the push routes keep in PostgreSQL (part 2 "Declared push route" rules 10-12) against a real
database: one plugin call per Idempotency-Key even when two requests race, fingerprints refused
within their window and free after it, and the audit committed with its counters or 503."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from contentsvc.connectors import push_store
from contentsvc.domain.errors import ApiError



def run(coroutine):
    return asyncio.run(coroutine)


def test_a_key_is_answered_once_and_replayed_after(databases):
    url = databases.create()

    async def scenario():
        async with await AsyncConnection.connect(url) as a, await AsyncConnection.connect(url) as b:
            first = await push_store.reserve_key(a, "con_push", "k1", "ingest", 86400)
            assert first is None  # this request calls the plugin
            with pytest.raises(ApiError) as racing:  # the same key while the first is under way
                await push_store.reserve_key(b, "con_push", "k1", "ingest", 86400)
            assert (racing.value.status, racing.value.code, racing.value.retryable) == (409, "idempotency_conflict",
                                                                                      True)
            await push_store.complete_key(a, "con_push", "k1", push_store.StoredAnswer(202, "application/json", b"{}"))
            replay = await push_store.reserve_key(b, "con_push", "k1", "other_route", 86400)
            assert replay == push_store.StoredAnswer(202, "application/json", b"{}")  # even on another route
            # A transient failure frees its key for the retry.
            assert await push_store.reserve_key(a, "con_push", "k2", "ingest", 86400) is None
            await push_store.complete_key(a, "con_push", "k2", None)
            assert await push_store.reserve_key(b, "con_push", "k2", "ingest", 86400) is None
    run(scenario())


def test_fingerprints_are_refused_within_their_window_only(databases):
    url = databases.create()

    async def scenario():
        async with await AsyncConnection.connect(url) as conn:
            prints = [push_store.fingerprint("signature", "sha256=abc")]
            await push_store.reserve_fingerprints(conn, "con_push", prints, 300)
            with pytest.raises(ApiError) as replayed:
                await push_store.reserve_fingerprints(conn, "con_push", prints, 300)
            assert replayed.value.code == "push_replayed"
            await push_store.reserve_fingerprints(conn, "con_other", prints, 300)  # per Connector
            await conn.execute("UPDATE connector_push_fingerprints SET expires_at = now() - interval '1 second'")
            await conn.commit()
            await push_store.reserve_fingerprints(conn, "con_push", prints, 300)  # the window has passed
    run(scenario())


def attempt(status: int, code: str | None = None, counter: str | None = None) -> push_store.Attempt:
    return push_store.Attempt("con_push", "org", "c1", "ingest", "POST", status, code, "127.0.0.1", counter)


def test_the_audit_commits_its_event_with_the_counters_or_answers_503(databases):
    # part 2 "Declared push route" rule 11: every attempt's event and counters commit before the answer
    url = databases.create()

    async def scenario():
        async with await AsyncConnection.connect(url) as conn:
            await push_store.record_attempts(conn, [attempt(202)])
            await push_store.record_attempts(conn, [attempt(429, "rate_limited", "rate_limited")])
            counters = await push_store.counters(conn, "con_push")
            assert (counters["received"], counters["refused"], counters["rate_limited"]) == (1, 1, 1)
            cur = await conn.execute("SELECT kind, corpus_id, subject_type FROM journal WHERE subject_id = 'con_push'"
                                     " ORDER BY position")
            assert await cur.fetchall() == [("connector.push.received", "c1", "connector"),
                                            ("connector.push.refused", "c1", "connector")]
            await conn.commit()
            await conn.execute("ALTER TABLE connector_push_counters RENAME TO counters_gone")  # storage fails
            await conn.commit()
            with pytest.raises(ApiError) as refused:
                await push_store.record_attempts(conn, [attempt(202)])
            assert (refused.value.status, refused.value.code) == (503, "audit_unavailable")
        with psycopg.connect(url) as check:  # nothing of the failed audit was committed
            assert check.execute("SELECT count(*) FROM journal WHERE subject_id = 'con_push'").fetchone()[0] == 2
    run(scenario())


def test_concurrent_attempts_on_a_connector_share_one_audit_commit(databases):
    # rule 11 under load: each attempt still has its own event; the counters move by the group's sums
    url = databases.create()

    async def scenario():
        async with AsyncConnectionPool(url, min_size=1, max_size=4, open=False) as pool:
            audit = push_store.PushAudit(pool)
            attempts = [attempt(202) for _ in range(30)] + [attempt(409, "push_replayed") for _ in range(5)] + \
                [attempt(202, None, "replayed") for _ in range(3)]
            await asyncio.gather(*(audit.record(a) for a in attempts))
            async with pool.connection() as conn:
                counters = await push_store.counters(conn, "con_push")
                cur = await conn.execute("SELECT count(*), count(DISTINCT xmin::text) FROM journal WHERE subject_id = 'con_push'")
                events, transactions = await cur.fetchone()
        assert (counters["received"], counters["refused"], counters["replayed"]) == (33, 5, 3)
        assert events == 38 and transactions < 38
    run(scenario())


def test_what_a_push_reads_is_announced_when_it_changes_and_the_worker_columns_are_not(databases):
    # schema/026: the API's cache of pushed-to Connectors is dropped by these announcements
    # (storage/notified_cache.py); the worker's checkpoint and counters change at every run unheard.
    url = databases.create()
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url, autocommit=True) as conn:
        listener.execute("LISTEN contentsvc_connectors")
        listener.execute("LISTEN contentsvc_plans")
        conn.execute(
            "INSERT INTO connectors (connector_id, org_id, corpus_id, source_namespace, kind, config, interval_seconds,"
            " health_policy, push_policy, created_at, health) VALUES ('con_a', 'org', 'cor', 'ns', 'fixture', '{}',"
            " 60, '{}', '{}', now(), '{}')")
        conn.execute("UPDATE connectors SET checkpoint = '{\"offset\": 3}', items_read_today = 3,"
                     " next_run_at = now() WHERE connector_id = 'con_a'")
        conn.execute("UPDATE connectors SET push_policy = '{\"allowed_cidrs\": [\"10.0.0.0/8\"]}'"
                     " WHERE connector_id = 'con_a'")
        conn.execute("UPDATE connectors SET enabled = false WHERE connector_id = 'con_a'")
        conn.execute("INSERT INTO plugin_plans (plan_id, source, roles, created_at, activated_at)"
                     " VALUES ('plan_x', 'api', '[]', now(), now())")
        conn.execute("DELETE FROM connectors WHERE connector_id = 'con_a'")
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=1.0)]
    assert heard == [("contentsvc_connectors", "con_a"), ("contentsvc_connectors", "con_a"),
                     ("contentsvc_plans", "plan_x"), ("contentsvc_connectors", "con_a")]
