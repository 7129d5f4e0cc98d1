"""A busy API is not an unavailable database: when every pooled connection stays lent to other
requests for `pool_wait_seconds` (3 s) while PostgreSQL answers, a request is refused with 429
`server_busy` and Retry-After (part 1 "Errors": 429 throttled), not 503 `storage_unavailable`,
and the requests holding the connections finish normally (docs/decisions.md "A slow or dead
database")."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg

from tests.conftest import LOCK_WAITERS, assert_error, create_corpus, json_lines, until

POOL_SIZE = 16  # the API's pool (storage/database.py async_pool)


def test_a_full_pool_answers_429_server_busy_and_the_holders_finish(server, api):
    corpus_id = create_corpus(api)
    assert api.get(f"/v0/corpora/{corpus_id}").status_code == 200  # the key is cached: no read for it
    with psycopg.connect(server.database_url) as locker, ThreadPoolExecutor(POOL_SIZE + 5) as requests:
        # Every corpus read waits while the table is locked, keeping its pooled connection.
        locker.execute("LOCK TABLE corpora IN ACCESS EXCLUSIVE MODE")
        answers = [requests.submit(api.get, f"/v0/corpora/{corpus_id}") for _ in range(POOL_SIZE + 4)]
        until(lambda: locker.execute(LOCK_WAITERS, ("corpora",)).fetchone()[0] >= POOL_SIZE,
              "every pooled connection held", timeout=3)
        health = requests.submit(api.get, "/v0/health")  # it too waits for a connection, and finds none
        refused = until(lambda: [a.result() for a in answers if a.done()], "the requests beyond the pool's",
                        timeout=6)
        locker.rollback()  # before the holders' unresponsive_seconds (7 s) run out
        statuses = sorted(a.result().status_code for a in answers)
    assert statuses.count(429) >= 1 and set(statuses) == {200, 429}, statuses
    # decisions.md: health is 200 while PostgreSQL answers; a busy pool is not an unready database.
    assert health.result().status_code == 200, health.result().text
    busy = assert_error(next(r for r in refused if r.status_code == 429), 429, "server_busy")
    assert busy["retryable"] is True
    assert next(r for r in refused if r.status_code == 429).headers["Retry-After"] == "1"
    events = [line.get("event") for line in json_lines(server.log_path)]
    assert "server_busy" in events and "unhandled_error" not in events
