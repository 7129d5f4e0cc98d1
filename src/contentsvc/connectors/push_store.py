"""What the push routes keep in PostgreSQL (part 2 "Declared push route" rules 10-12):

- the replay cache: the first completed answer per Connector and Idempotency-Key of a
  service_key or instance_token route. A key is reserved (status NULL) before the plugin is
  called; a second request with the key while the first is under way is 409
  `idempotency_conflict` (retryable), never a second plugin call; an attempt that ends without
  an answer worth keeping (a transient 503) frees its key for a retry;
- fingerprints of signature routes (the signature, and the Idempotency-Key when given), reserved
  for the route's window before the plugin call: a duplicate is 409 `push_replayed`;
- the audit: `connector.push.received` or `.refused` and the Connector's push counters, committed
  before the answer leaves: in the transaction that accepts a push's items when they are all
  newly accepted (connectors/push_ingests.py), else in one of their own (concurrent attempts on
  one Connector share it); if that cannot be written, 503 `audit_unavailable`.

Expired rows are ignored on read; the connectors worker calls `sweep` once a minute.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from contentsvc.connectors.events import CONNECTOR_SUBJECT, ConnectorPushReceived, ConnectorPushRefused
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError
from contentsvc.journal.events import NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.storage.availability import StorageUnavailable
from contentsvc.storage.group_commit import GroupCommit
from contentsvc.storage.database import database_now


@dataclass(frozen=True)
class StoredAnswer:
    status: int
    content_type: str
    body: bytes


def audit_unavailable() -> ApiError:
    return ApiError(503, "audit_unavailable", "The push could not be recorded; retry later.", retryable=True,
                    headers={"Retry-After": "5"})


async def reserve_key(conn: AsyncConnection, connector_id: str, key: str, route: str,
                      ttl_seconds: int) -> StoredAnswer | None:
    """None: the key is this request's now. A stored answer: replay it. Under way elsewhere: 409."""
    async with conn.transaction():
        now = await database_now(conn)
        await conn.execute("DELETE FROM connector_push_replays WHERE connector_id = %s AND idempotency_key = %s"
                           " AND expires_at <= %s", (connector_id, key, now))
        cur = await conn.execute(
            "INSERT INTO connector_push_replays (connector_id, idempotency_key, route, expires_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (connector_id, key, route, now + timedelta(seconds=ttl_seconds)))
        if await cur.fetchone() is not None:
            return None
        cur = await conn.execute("SELECT status, content_type, body FROM connector_push_replays"
                                 " WHERE connector_id = %s AND idempotency_key = %s", (connector_id, key))
        status, content_type, body = await cur.fetchone()
    if status is None:
        raise ApiError(409, "idempotency_conflict", "A request with this Idempotency-Key is still being processed.",
                       retryable=True)
    return StoredAnswer(status, content_type, bytes(body))


async def complete_key(conn: AsyncConnection, connector_id: str, key: str, answer: StoredAnswer | None) -> None:
    """Keep the answer for replays, or (None) free the key for a retry."""
    async with conn.transaction():
        if answer is None:
            await conn.execute("DELETE FROM connector_push_replays WHERE connector_id = %s AND idempotency_key = %s"
                               " AND status IS NULL", (connector_id, key))
        else:
            await conn.execute("UPDATE connector_push_replays SET status = %s, content_type = %s, body = %s"
                               " WHERE connector_id = %s AND idempotency_key = %s",
                               (answer.status, answer.content_type, answer.body, connector_id, key))


def fingerprint(kind: str, value: str) -> bytes:
    return hashlib.sha256(f"{kind}\x00{value}".encode()).digest()


async def reserve_fingerprints(conn: AsyncConnection, connector_id: str, fingerprints: list[bytes],
                               window_seconds: int) -> None:
    """All or none, committed before the plugin is called; any one seen within the window: 409."""
    try:
        async with conn.transaction():
            now = await database_now(conn)
            await conn.execute("DELETE FROM connector_push_fingerprints WHERE connector_id = %s AND expires_at <= %s",
                               (connector_id, now))
            for value in fingerprints:
                cur = await conn.execute(
                    "INSERT INTO connector_push_fingerprints (connector_id, fingerprint, expires_at)"
                    " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                    (connector_id, value, now + timedelta(seconds=window_seconds)))
                if await cur.fetchone() is None:
                    raise ApiError(409, "push_replayed", "This signature or Idempotency-Key was already received.")
    except psycopg.Error as exc:
        raise ApiError(503, "audit_unavailable", "The signature could not be reserved; retry later.",
                       retryable=True, headers={"Retry-After": "5"}) from exc


@dataclass(frozen=True)
class Attempt:
    """One push attempt as the audit records it; `counter` names the counter it bumps besides
    received/refused (`replayed`, `rate_limited`)."""

    connector_id: str
    org_id: str
    corpus_id: str
    route: str
    method: str
    status: int
    code: str | None
    client_ip: str
    counter: str | None = None


async def write_attempts(conn: AsyncConnection, attempts: list[Attempt]) -> None:
    """The audit events of one Connector's attempts and its counters, inside the caller's journal
    transaction (the last writes before its commit)."""
    connector_id = attempts[0].connector_id
    received = sum(1 for a in attempts if 200 <= a.status < 300)
    moved = {"received": received, "refused": len(attempts) - received,
             "replayed": sum(1 for a in attempts if a.counter == "replayed"),
             "rate_limited": sum(1 for a in attempts if a.counter == "rate_limited")}
    # Stamped by this process's clock, as a Receipt's accepted_at is, and the counters written in one
    # upsert: nothing in the transaction waits for an answer, so it goes out in one flush.
    now = datetime.now(UTC)
    events = []
    for a in attempts:
        payload_type = ConnectorPushReceived if 200 <= a.status < 300 else ConnectorPushRefused
        payload = payload_type(connector_id=a.connector_id, route=a.route, method=a.method, status=a.status,
                               client_ip=a.client_ip, at=iso(now))
        if a.code is not None:
            payload.code = a.code
        events.append(NewEvent(org_id=a.org_id, corpus_id=a.corpus_id, subject_type=CONNECTOR_SUBJECT,
                               subject_id=a.connector_id, payload=payload))
    await conn.execute(
        "INSERT INTO connector_push_counters AS c (connector_id, received, refused, replayed, rate_limited,"
        "                                          last_received_at, last_refused_at)"
        " VALUES (%(connector_id)s, %(received)s, %(refused)s, %(replayed)s, %(rate_limited)s,"
        "         CASE WHEN %(received)s > 0 THEN %(now)s END, CASE WHEN %(refused)s > 0 THEN %(now)s END)"
        " ON CONFLICT (connector_id) DO UPDATE SET received = c.received + excluded.received,"
        " refused = c.refused + excluded.refused, replayed = c.replayed + excluded.replayed,"
        " rate_limited = c.rate_limited + excluded.rate_limited,"
        " last_received_at = coalesce(excluded.last_received_at, c.last_received_at),"
        " last_refused_at = coalesce(excluded.last_refused_at, c.last_refused_at)",
        {**moved, "now": now, "connector_id": connector_id})
    await append(conn, events)


async def record_attempts(conn: AsyncConnection, attempts: list[Attempt]) -> list[None]:
    """write_attempts in a transaction of their own (503 audit_unavailable when it fails)."""
    try:
        async with journal_transaction(conn):
            await write_attempts(conn, attempts)
    except psycopg.Error as exc:
        raise audit_unavailable() from exc
    return [None] * len(attempts)


class PushAudit:
    """Concurrent attempts on one Connector recorded in one transaction (storage/group_commit.py):
    each still returns only once its own record has committed."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self._groups: GroupCommit[str, Attempt, None] = GroupCommit(self._commit)

    async def record(self, attempt: Attempt) -> None:
        await self._groups.submit(attempt.connector_id, attempt)

    async def _commit(self, connector_id: str, attempts: list[Attempt]) -> list[None]:
        try:
            async with self.pool.connection() as conn:
                return await record_attempts(conn, attempts)
        except (psycopg.Error, StorageUnavailable) as exc:  # no connection to be had
            raise audit_unavailable() from exc


async def counters(conn: AsyncConnection, connector_id: str) -> dict:
    cur = await conn.execute("SELECT received, refused, replayed, rate_limited, last_received_at, last_refused_at"
                             " FROM connector_push_counters WHERE connector_id = %s", (connector_id,))
    row = await cur.fetchone()
    out = {"received": 0, "refused": 0, "replayed": 0, "rate_limited": 0}
    if row is not None:
        out.update(received=row[0], refused=row[1], replayed=row[2], rate_limited=row[3])
        if row[4] is not None:
            out["last_received_at"] = iso(row[4])
        if row[5] is not None:
            out["last_refused_at"] = iso(row[5])
    return out


async def sweep(conn: AsyncConnection) -> None:
    async with conn.transaction():
        await conn.execute("DELETE FROM connector_push_replays WHERE expires_at <= now()")
        await conn.execute("DELETE FROM connector_push_fingerprints WHERE expires_at <= now()")
