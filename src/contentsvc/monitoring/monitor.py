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

import psycopg
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
    fingerprint,
    part_keys,
    plan_batches,
    subscription_request,
)
from contentsvc.monitoring.evaluation_request import BUILTIN_NORMALIZATION, RecordVersion, record_object
from contentsvc.plugins.client import PluginClients, PluginFailed, PluginUnreachable, random_backoff_delay
from contentsvc.plugins.plans import ActivePlan, Provider
from contentsvc.projectors.base import TableFold, counted, oldest_due

log = get_logger("contentsvc.monitor")

IN_FLIGHT_POLL_SECONDS = 0.05
DUE_POLL_CAP_SECONDS = 1.0  # retries come due without a commit to wake the runner
VERSIONS_PER_SCAN = 4  # Versions whose due evaluations one scan reads (all of each: one request per expression)
SAFETY_SCAN_SECONDS = 10.0
KNOWN_VERSIONS_MAX = 100_000  # Subscription Versions whose (immutable) facts are kept in memory
_EVALUATION_COLUMNS = ("subscription_version_id, version_id, subscription_id, org_id, corpus_id, record_id,"
                       " attempts")  # a scan now and then even when memory says nothing is due
NOT_READY_SWEEP_SECONDS = 60.0


@dataclass
class Queued:
    """One planned request not sent yet: all requests of a Version are planned at once, so each
    distinct (expression, configuration) is sent once per Version; slots send them in turn."""

    version_id: str
    provider: Provider
    body: dict[str, Any]
    batch: Batch
    part_keys: set[str]
    rows: dict[str, dict]


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
    reads = frozenset({ev.RECORD_AVAILABILITY_CHANGED, ev.RECORD_ENRICHED, me.SUBSCRIPTION_COMMITTED,
                       ev.RECORD_WITHDRAWN})  # what `apply` folds
    # It does not rest in bursts of ingests (Projector.rests_in_ingest_bursts): its steps evaluate
    # Subscriptions, and resting after them delayed webhooks (bench monitoring, 5 Records/s: 202
    # to webhook p50 1.2 s against 0.37 s).

    @staticmethod
    def waiting(conn: psycopg.Connection) -> str:
        # The table holds only the evaluations still to decide (schema/031).
        pending, due, late = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE next_attempt_at <= now()),"
            " now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now()) FROM monitor_evaluations").fetchone()
        return f"{counted(pending, 'evaluation')} pending ({due:,} due{oldest_due(late)})"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan = ActivePlan(settings)
        self._clients = PluginClients()
        self._calls: list[Call] = []
        self._queued: list[Queued] = []
        # Where due evaluations may be, kept in memory so a step scans only when some may be due:
        # the fold armed some (or the worker just started), a retry comes due, or the last scan
        # stopped at its limit. This worker is the one writer of monitor_evaluations.
        self._more_due = True
        self._next_due_at: float | None = None  # monotonic time of the earliest future retry
        self._scanned_at = 0.0
        self._expiry_checked = 0.0
        # Subscription Versions and Saved Query Versions never change: what a request needs of one
        # (its expression, evaluator, destination, fingerprint) is read once, not with every row.
        self._known: dict[str, dict] = {}
        self._fingerprints: dict[str, str] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> "MonitorWorker":
        return cls(settings)

    def idle_poll_seconds(self) -> float | None:
        if self._calls or self._queued:
            return IN_FLIGHT_POLL_SECONDS
        if self._next_due_at is None:
            return None
        return min(max(self._next_due_at - time.monotonic(), IN_FLIGHT_POLL_SECONDS), DUE_POLL_CAP_SECONDS)

    def _due_at(self, delay_seconds: float) -> None:
        at = time.monotonic() + delay_seconds
        self._next_due_at = at if self._next_due_at is None else min(self._next_due_at, at)

    # ------------------------------------------------------------ the fold

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        out: list[NewEvent] = []
        deliveries = self.settings.deliveries
        not_ready_max = self.settings.monitoring.not_ready_max_seconds
        # Versions made current and enriched are folded a run at a time, one statement each (the
        # common case: ingestion). The other kinds end a run: their order against it matters.
        made_current: list[JournalEvent] = []
        enriched: list[str] = []

        async def fold_run() -> None:
            await matches.fold_made_current(conn, made_current, not_ready_max)
            await matches.fold_enriched(conn, enriched, not_ready_max)
            if made_current or enriched:
                self._more_due = True
            made_current.clear()
            enriched.clear()

        for e in events:
            p = e.payload
            if e.kind == ev.RECORD_AVAILABILITY_CHANGED and matches.makes_current(p):
                made_current.append(e)
            elif e.kind == ev.RECORD_ENRICHED:
                enriched.append(p.version_id)
            elif e.kind == me.SUBSCRIPTION_COMMITTED:
                await fold_run()
                await matches.fold_subscription(conn, e)
            elif e.kind == ev.RECORD_AVAILABILITY_CHANGED and matches.ends_currentness(p):
                await fold_run()
                out.extend(await matches.fold_not_current(conn, e, deliveries))
            elif e.kind == ev.RECORD_WITHDRAWN:
                await fold_run()
                out.extend(await matches.fold_withdrawn(conn, e, deliveries))
        await fold_run()
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

    async def open(self, conn: AsyncConnection) -> None:
        await super().open(conn)
        self._more_due = True  # at start or after a reconnection memory knows nothing of what is due

    async def _start_calls(self, conn: AsyncConnection) -> bool:
        settled = False
        now = time.monotonic()
        scan = len(self._calls) < self.settings.monitoring.evaluation_concurrency and not self._queued and (
            self._more_due or (self._next_due_at is not None and self._next_due_at <= now)
            or now >= self._scanned_at + SAFETY_SCAN_SECONDS)
        if scan or now >= self._expiry_checked + NOT_READY_SWEEP_SECONDS:
            async with journal_transaction(conn):
                await self._drop_expired_not_ready(conn)
                if scan:
                    settled = await self._scan_due(conn)
        self._send_queued()
        return settled

    def _send_queued(self) -> None:
        free = self.settings.monitoring.evaluation_concurrency - len(self._calls)
        timeout = float(self.settings.monitoring.evaluator_timeout_seconds)
        while free > 0 and self._queued:
            q = self._queued.pop(0)
            client = self._clients.client(q.provider.target)
            task = asyncio.create_task(client.invoke("subscription", q.body, timeout))
            self._calls.append(Call(q.version_id, q.batch, q.part_keys, q.rows, task))
            free -= 1

    async def _scan_due(self, conn: AsyncConnection) -> bool:
        """Plan every request of the next due Versions (not in flight or queued): all their due
        evaluations are read together, so identical (expression, configuration) are one evaluation."""
        self._scanned_at = time.monotonic()
        self._next_due_at = None
        settled = False
        await self.plan.refresh_if_due(conn)
        busy = sorted({c.version_id for c in self._calls} | {q.version_id for q in self._queued})
        cur = await conn.execute(
            "SELECT version_id FROM monitor_evaluations WHERE next_attempt_at <= now()"
            " AND version_id <> ALL(%s) GROUP BY version_id ORDER BY min(next_attempt_at), version_id LIMIT %s",
            (busy, VERSIONS_PER_SCAN))
        version_ids = [r[0] for r in await cur.fetchall()]
        self._more_due = len(version_ids) == VERSIONS_PER_SCAN
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            f"SELECT {_EVALUATION_COLUMNS} FROM monitor_evaluations"
            " WHERE version_id = ANY(%s) AND next_attempt_at <= now()"
            " ORDER BY version_id, subscription_version_id", (version_ids,))
        rows_due = await cur.fetchall()
        await self._know(conn, {r["subscription_version_id"] for r in rows_due})
        groups: dict[tuple[str, str, str], list[dict]] = {}
        for r in rows_due:
            facts = self._known.get(r["subscription_version_id"])
            if facts is None:  # no such Subscription Version (cannot happen: the row names one)
                continue
            r.update(facts)
            ev_ = r["evaluator"]
            groups.setdefault((r["version_id"], ev_["plugin_id"], ev_["version"]), []).append(r)
        for (version_id, plugin_id, plugin_version), rows in groups.items():
            provider = self._provider(plugin_id)
            if provider is None or provider.version != plugin_version:
                await self.plan.refresh(conn)  # the cached plan may predate the Subscription's
                provider = self._provider(plugin_id)
            if provider is None or provider.version != plugin_version:
                # The pinned evaluator version left the plan: nothing can decide these any more.
                await self._fail_all(conn, rows, version_id)
                settled = True
                continue
            record = await self._record(conn, version_id, rows[0]["corpus_id"])
            if record is None:  # no text to send (cannot happen for a current Version)
                await self._fail_all(conn, rows, version_id)
                settled = True
                continue
            subscription = provider.manifest.contributions.subscription
            pending = [Pending(r["subscription_id"], r["subscription_version_id"], r["saved_query_id"],
                               r["saved_query_version_id"], r["owner"], r["expression"],
                               r["evaluator"].get("configuration") or {}) for r in rows]
            by_sv = {r["subscription_version_id"]: r for r in rows}
            keys = part_keys(record)
            for batch in plan_batches(version_id, pending, subscription.max_batch_size, self._fingerprints):
                body = subscription_request(new_id("inv"), rows[0]["org_id"], record, batch,
                                            provider.settings.configuration)
                members = {p.subscription_version_id: by_sv[p.subscription_version_id]
                           for subs in batch.members.values() for p in subs}
                self._queued.append(Queued(version_id, provider, body, batch, keys, members))
        if not self._more_due:
            cur = await conn.execute("SELECT extract(epoch FROM min(next_attempt_at) - now()) FROM monitor_evaluations"
                                     " WHERE next_attempt_at > now()")
            row = await cur.fetchone()
            if row[0] is not None:
                self._due_at(float(row[0]))
        return settled

    async def _know(self, conn: AsyncConnection, subscription_version_ids: set[str]) -> None:
        missing = sorted(subscription_version_ids - self._known.keys())
        if not missing:
            return
        if len(self._known) + len(missing) > KNOWN_VERSIONS_MAX:
            self._known.clear()
            self._fingerprints.clear()
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT v.version_id, v.saved_query_id, v.saved_query_version_id, v.owner, v.evaluator, v.destination_id,"
            "       q.expression"
            " FROM subscription_versions v JOIN saved_query_versions q ON q.version_id = v.saved_query_version_id"
            " WHERE v.version_id = ANY(%s)", (missing,))
        for r in await cur.fetchall():
            sv = r.pop("version_id")
            self._known[sv] = r
            self._fingerprints[sv] = fingerprint(r["expression"], r["evaluator"].get("configuration") or {})

    async def _fail_all(self, conn: AsyncConnection, rows: list[dict], version_id: str) -> None:
        await checkpoints.position(conn, self.name, for_update=True)
        for r in rows:
            if await matches.is_pending(conn, r["subscription_version_id"], version_id):
                await matches.settle_failed(conn, r, matches.EVALUATOR_FAILED)

    def _provider(self, plugin_id: str) -> Provider | None:
        return self.plan.provider(f"subscription:{plugin_id}")

    async def _drop_expired_not_ready(self, conn: AsyncConnection) -> None:
        """not_ready evaluations no trigger came back for within not_ready_max_seconds are dropped."""
        if time.monotonic() < self._expiry_checked + NOT_READY_SWEEP_SECONDS:
            return
        self._expiry_checked = time.monotonic()
        await matches.drop_expired_not_ready(conn, self.settings.monitoring.not_ready_max_seconds)

    async def _record(self, conn: AsyncConnection, version_id: str, corpus_id: str) -> dict | None:
        cur = await conn.execute("SELECT position, payload FROM journal WHERE version_id = %s"
                                 " AND kind = 'record.accepted' ORDER BY position LIMIT 1", (version_id,))
        row = await cur.fetchone()
        if row is None:
            return None
        return record_request(row[1], corpus_id, await matches.is_enriched(conn, version_id))

    async def _settle_calls(self, conn: AsyncConnection) -> bool:
        """Every finished call of the step in one transaction (one journal append): the pairs still
        pending read in one statement, no_match and match decisions written set-based."""
        done = [c for c in self._calls if c.task.done()]
        if not done:
            return False
        self._calls = [c for c in self._calls if not c.task.done()]
        not_ready_max = self.settings.monitoring.not_ready_max_seconds
        async with journal_transaction(conn):
            # Under the checkpoint's lock: the fold (a withdrawal, a disable) does not interleave.
            await checkpoints.position(conn, self.name, for_update=True)
            pending = await matches.pending_pairs(conn, [key for call in done for key in call.keys])
            no_match: list[dict] = []
            match: list[tuple[dict, dict]] = []
            for call in done:
                rows = {sv: r for sv, r in call.rows.items() if (sv, call.version_id) in pending}
                if rows:
                    await self._settle(conn, call, rows, not_ready_max, no_match, match)
            await append(conn, await matches.settle_decided_many(conn, no_match, match, self.settings.deliveries))
        return True

    async def _settle(self, conn: AsyncConnection, call: Call, rows: dict[str, dict], not_ready_max: int,
                      no_match: list[dict], match: list[tuple[dict, dict]]) -> None:
        """One call's outcome: failures, retries and not_ready written here (rare), the decisions
        added to `no_match` and `match` for the step's set-based settle."""
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
                self._due_at(delay)
            else:
                log.warning("evaluation_failed", version_id=call.version_id, code=exc.code)
                for r in rows.values():
                    await matches.settle_failed(conn, r, matches.EVALUATOR_FAILED)
            return
        except InvalidOutput as exc:
            log.warning("evaluation_invalid_output", version_id=call.version_id, cause=str(exc)[:200])
            for r in rows.values():
                await matches.settle_failed(conn, r, matches.EVALUATOR_INVALID_OUTPUT)
            return
        except Exception as exc:  # a defect of the attempt, not an answer: try again later
            log.error("evaluation_attempt_failed", version_id=call.version_id, error=type(exc).__name__)
            for r in rows.values():
                delay = random_backoff_delay(r["attempts"] + 1)
                await matches.settle_retry(conn, r, delay, type(exc).__name__)
                self._due_at(delay)
            return
        for eid, subs in call.batch.members.items():
            decision = decisions[eid]
            for p in subs:
                r = rows.get(p.subscription_version_id)
                if r is None:
                    continue
                if decision["decision"] == "match":
                    match.append((r, decision["evidence"]))
                elif decision["decision"] == "no_match":
                    no_match.append(r)
                else:
                    await matches.settle_not_ready(conn, r, not_ready_max)
