"""The `monitor` worker (decisions-part2 "Evaluation trigger and eligibility", "Matches";
design.md "Part 2": calls outside transactions, results committed idempotently).

A fold over the journal like the materializer (projectors/materializer.py). In the checkpoint's
transaction it only writes rows (monitoring/matches.py): Subscriptions as of the event's position,
pending evaluations at each trigger, withdrawals of Matches. Beside the fold, due evaluations of
one Record Version are grouped per evaluator, deduplicated and batched (monitoring/batches.py)
and sent as tasks with no transaction open; each finished call is settled in a transaction of its
own under the checkpoint's lock: Matches with their `match.created` Delivery and change event, or
`no_match`, or `not_ready` (waits for the Version's next trigger), or a retry with backoff 1, 2,
4 ... 60 s (retryable errors and unreachability, no limit while the evaluator version stays in the
plan), or a terminal failure (`evaluator_failed`, `evaluator_invalid_output` on the Subscription).

A crash between a call and its commit leaves the evaluation pending: it is called again with the
same idempotency key, and the Match is unique per (Subscription Version, Record Version).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from contentsvc.config import Settings
from contentsvc.ids import new_id
from contentsvc.journal import checkpoints
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.monitoring import events as me
from contentsvc.monitoring import matches
from contentsvc.monitoring.batches import (
    Batch,
    InvalidOutput,
    Pending,
    check_answer,
    part_keys,
    plan_batches,
    subscription_request,
)
from contentsvc.monitoring.evaluation_request import BUILTIN_NORMALIZATION, RecordVersion, record_object
from contentsvc.plugins.client import PluginClient, PluginFailed, PluginUnreachable, random_backoff_delay
from contentsvc.plugins.plans import ActivePlan, Provider
from contentsvc.projectors.base import TableFold

log = get_logger("contentsvc.monitor")

IN_FLIGHT_POLL_SECONDS = 0.05
DUE_POLL_CAP_SECONDS = 1.0  # retries come due without a commit to wake the runner
DUE_SCAN_LIMIT = 512
NOT_READY_SWEEP_SECONDS = 60.0


@dataclass
class Call:
    """One subscription request in flight for one Record Version."""

    version_id: str
    batch: Batch
    part_keys: set[str]
    rows: dict[str, dict]  # subscription_version_id -> its pending row (with its Subscription Version)
    task: asyncio.Task

    @property
    def keys(self) -> list[tuple[str, str]]:
        return [(sv, self.version_id) for sv in self.rows]


def record_request(accepted: dict[str, Any], corpus_id: str, enriched: bool) -> dict[str, Any]:
    """The request's `record`, from the Version's record.accepted payload."""
    p = accepted
    provenance = p.get("provenance") or {}
    version = RecordVersion(corpus_id=corpus_id, record_id=p["record_id"], record_version_id=p["version_id"],
                            namespace=p["source"]["namespace"], record_key=p["source"]["record_key"],
                            accepted_at=p["accepted_at"], manifest=p["manifest"], provenance=provenance,
                            extensions=p.get("extensions"))
    return record_object(version, enriched, provenance.get("normalization") or BUILTIN_NORMALIZATION)


class MonitorWorker(TableFold):
    name = "monitor"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan = ActivePlan(settings)
        self._clients: dict[str, PluginClient] = {}
        self._calls: list[Call] = []
        self._due_poll: float | None = None
        self._expiry_checked = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> "MonitorWorker":
        return cls(settings)

    def idle_poll_seconds(self) -> float | None:
        return IN_FLIGHT_POLL_SECONDS if self._calls else self._due_poll

    # ------------------------------------------------------------ the fold

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        out: list[NewEvent] = []
        deliveries = self.settings.deliveries
        not_ready_max = self.settings.monitoring.not_ready_max_seconds
        for e in events:
            p = e.payload
            if e.kind == me.SUBSCRIPTION_COMMITTED:
                await matches.fold_subscription(conn, e)
            elif e.kind == ev.RECORD_AVAILABILITY_CHANGED:
                if matches.makes_current(p):
                    await matches.fold_made_current(conn, e, not_ready_max)
                elif matches.ends_currentness(p):
                    out.extend(await matches.fold_not_current(conn, e, deliveries))
            elif e.kind == ev.RECORD_ENRICHED:
                await matches.fold_enriched(conn, p.version_id, not_ready_max)
            elif e.kind == ev.RECORD_WITHDRAWN:
                out.extend(await matches.fold_withdrawn(conn, e, deliveries))
        await append(conn, out)

    async def step(self, conn: AsyncConnection) -> bool:
        more = await super().step(conn)
        more = await self._settle_calls(conn) or more
        more = await self._start_calls(conn) or more
        if not more and self._calls:
            done, _ = await asyncio.wait([c.task for c in self._calls], timeout=IN_FLIGHT_POLL_SECONDS)
            more = bool(done)
        return more

    # ------------------------------------------------------------ calls beside the fold

    def _client(self, provider: Provider) -> PluginClient:
        client = self._clients.get(provider.registration_id)
        if client is None:
            client = self._clients[provider.registration_id] = PluginClient(provider.target)
        return client

    async def _start_calls(self, conn: AsyncConnection) -> bool:
        free = self.settings.monitoring.evaluation_concurrency - len(self._calls)
        in_flight = {key for call in self._calls for key in call.keys}
        settled = False
        async with journal_transaction(conn):
            await self.plan.refresh_if_due(conn)
            await self._drop_expired_not_ready(conn)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT e.*, v.saved_query_id, v.saved_query_version_id, v.owner, v.evaluator, v.destination_id,"
                "       q.expression"
                " FROM monitor_evaluations e"
                " JOIN subscription_versions v ON v.version_id = e.subscription_version_id"
                " JOIN saved_query_versions q ON q.version_id = v.saved_query_version_id"
                " WHERE e.state = 'pending' AND e.next_attempt_at <= now()"
                " ORDER BY e.next_attempt_at, e.version_id LIMIT %s", (DUE_SCAN_LIMIT,))
            due = [r for r in await cur.fetchall()
                   if (r["subscription_version_id"], r["version_id"]) not in in_flight]
            groups: dict[tuple[str, str, str], list[dict]] = {}
            for r in due:
                ev_ = r["evaluator"]
                groups.setdefault((r["version_id"], ev_["plugin_id"], ev_["version"]), []).append(r)
            for (version_id, plugin_id, plugin_version), rows in groups.items():
                if free <= 0:
                    break
                provider = self._provider(plugin_id, plugin_version)
                if provider is None or provider.version != plugin_version:
                    await self.plan.refresh(conn)  # the cached plan may predate the Subscription's
                    provider = self._provider(plugin_id, plugin_version)
                if provider is None or provider.version != plugin_version:
                    # The pinned evaluator version left the plan: nothing can decide these any more.
                    await checkpoints.position(conn, self.name, for_update=True)
                    for r in rows:
                        if await matches.lock_pending(conn, r["subscription_version_id"], version_id):
                            await matches.settle_failed(conn, r, matches.EVALUATOR_FAILED)
                    settled = True
                    continue
                record = await self._record(conn, version_id, rows[0]["corpus_id"])
                if record is None:  # no text to send (cannot happen for a current Version)
                    await checkpoints.position(conn, self.name, for_update=True)
                    for r in rows:
                        if await matches.lock_pending(conn, r["subscription_version_id"], version_id):
                            await matches.settle_failed(conn, r, matches.EVALUATOR_FAILED)
                    settled = True
                    continue
                subscription = provider.manifest.contributions.subscription
                pending = [Pending(r["subscription_id"], r["subscription_version_id"], r["saved_query_id"],
                                   r["saved_query_version_id"], r["owner"], r["expression"],
                                   r["evaluator"].get("configuration") or {}) for r in rows]
                by_sv = {r["subscription_version_id"]: r for r in rows}
                for batch in plan_batches(version_id, pending, subscription.max_batch_size):
                    if free <= 0:
                        break
                    body = subscription_request(new_id("inv"), rows[0]["org_id"], record, batch,
                                                provider.settings.configuration)
                    task = asyncio.create_task(self._client(provider).invoke(
                        "subscription", body, float(self.settings.monitoring.evaluator_timeout_seconds)))
                    members = {p.subscription_version_id: by_sv[p.subscription_version_id]
                               for subs in batch.members.values() for p in subs}
                    self._calls.append(Call(version_id, batch, part_keys(record),
                                            members, task))
                    free -= 1
            cur = await conn.execute("SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM monitor_evaluations"
                                     " WHERE state = 'pending' AND next_attempt_at IS NOT NULL")
            row = await cur.fetchone()
        self._due_poll = None if row[0] is None else min(max(float(row[0]), IN_FLIGHT_POLL_SECONDS),
                                                         DUE_POLL_CAP_SECONDS)
        return settled

    def _provider(self, plugin_id: str, plugin_version: str) -> Provider | None:
        return self.plan.provider(f"subscription:{plugin_id}")

    async def _drop_expired_not_ready(self, conn: AsyncConnection) -> None:
        """not_ready evaluations no trigger came back for within not_ready_max_seconds are dropped."""
        if time.monotonic() < self._expiry_checked + NOT_READY_SWEEP_SECONDS:
            return
        self._expiry_checked = time.monotonic()
        await conn.execute(
            "UPDATE monitor_evaluations SET state = 'dropped' WHERE state = 'pending' AND next_attempt_at IS NULL"
            " AND first_not_ready_at + make_interval(secs => %s) < now()",
            (self.settings.monitoring.not_ready_max_seconds,))

    async def _record(self, conn: AsyncConnection, version_id: str, corpus_id: str) -> dict | None:
        cur = await conn.execute("SELECT position, payload FROM journal WHERE version_id = %s"
                                 " AND kind = 'record.accepted' ORDER BY position LIMIT 1", (version_id,))
        row = await cur.fetchone()
        if row is None:
            return None
        return record_request(row[1], corpus_id, await matches.is_enriched(conn, version_id))

    async def _settle_calls(self, conn: AsyncConnection) -> bool:
        done = [c for c in self._calls if c.task.done()]
        if not done:
            return False
        self._calls = [c for c in self._calls if not c.task.done()]
        not_ready_max = self.settings.monitoring.not_ready_max_seconds
        async with journal_transaction(conn):
            # Under the checkpoint's lock: the fold (a withdrawal, a disable) does not interleave.
            await checkpoints.position(conn, self.name, for_update=True)
            out: list[NewEvent] = []
            for call in done:
                out.extend(await self._settle(conn, call, not_ready_max))
            await append(conn, out)
        return True

    async def _settle(self, conn: AsyncConnection, call: Call, not_ready_max: int) -> list[NewEvent]:
        pending = await matches.lock_pending_many(conn, list(call.rows), call.version_id)
        rows = {sv: r for sv, r in call.rows.items() if sv in pending}
        if not rows:
            return []
        try:
            answer = call.task.result()
            decisions = check_answer(answer, [e["id"] for e in call.batch.evaluations], call.part_keys)
        except (PluginUnreachable, PluginFailed) as exc:
            retry = isinstance(exc, PluginUnreachable) or exc.retryable
            if retry:
                attempts = max(r["attempts"] for r in rows.values()) + 1
                delay = random_backoff_delay(attempts)
                log.warning("evaluation_retry", version_id=call.version_id, attempts=attempts,
                            retry_in_s=round(delay, 1), cause=str(exc)[:200])
                for r in rows.values():
                    await matches.settle_retry(conn, r, delay, str(exc))
            else:
                log.warning("evaluation_failed", version_id=call.version_id, code=exc.code)
                for r in rows.values():
                    await matches.settle_failed(conn, r, matches.EVALUATOR_FAILED)
            return []
        except InvalidOutput as exc:
            log.warning("evaluation_invalid_output", version_id=call.version_id, cause=str(exc)[:200])
            for r in rows.values():
                await matches.settle_failed(conn, r, matches.EVALUATOR_INVALID_OUTPUT)
            return []
        except Exception as exc:  # a defect of the attempt, not an answer: try again later
            log.error("evaluation_attempt_failed", version_id=call.version_id, error=type(exc).__name__)
            for r in rows.values():
                await matches.settle_retry(conn, r, random_backoff_delay(r["attempts"] + 1), type(exc).__name__)
            return []
        out: list[NewEvent] = []
        no_match: list[dict] = []  # settled together: most of a request's decisions are no_match
        for eid, subs in call.batch.members.items():
            decision = decisions[eid]
            for p in subs:
                r = rows.get(p.subscription_version_id)
                if r is None:
                    continue
                if decision["decision"] == "match":
                    out.extend(await matches.settle_match(conn, r, r, decision["evidence"], self.settings.deliveries))
                elif decision["decision"] == "no_match":
                    no_match.append(r)
                else:
                    await matches.settle_not_ready(conn, r, not_ready_max)
        await matches.settle_no_match_many(conn, no_match)
        return out
