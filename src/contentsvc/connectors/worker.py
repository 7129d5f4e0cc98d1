"""The `connectors` worker (decisions-part2 "Runs"; design.md "Part 2"): queues each enabled
Connector's scheduled runs and carries out queued runs, page by page.

A step first queues a `schedule` run for every Connector whose next scheduled start has come
(missed slots collapse into one), then takes the oldest due queued run whose Connector has none
running, marks it `running` with the plan it starts under, and carries it out:

- each page is fetched with no transaction open (the plugin's `connector/fetch`, or the built-in
  `fixture` kind), checked (connectors/pages.py), then committed in ONE transaction with its
  Receipts (the normal ingestion path, keys `con:{connector_id}:{record_key}:{revision}`), the
  new checkpoint, the counters and `connector.run.changed`. A crash before that commit repeats
  the page on the next run from the old checkpoint; its items replay the same Receipts, so a
  page is never skipped and no Version is made twice;
- pages continue while the plugin says `more`, up to the kind's and the deployment's
  `max_pages_per_run`; a Connector disabled meanwhile stops after the page in hand;
- a failure (the plugin's error envelope with its `error_class` and code, the plugin unreachable
  after 5 tries, an answer breaking the protocol) ends the run `failed` with the checkpoint
  where the last committed page left it;
- at the end, health is evaluated again (connectors/health.py) and `connector.changed` is
  committed when its state moved.

Up to `[connectors] run_concurrency` runs proceed at once, one per Connector: their plugin calls
overlap, their statements take turns on the worker's one connection. A run left `running` by a
killed worker is taken up again (its Connector's checkpoint is the last committed page's) when a
worker starts.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from contentsvc.commands.records import Accepted
from contentsvc.config import Settings
from contentsvc.connectors import push_store, views
from contentsvc.connectors.attachments import Grants, blob_parts
from contentsvc.connectors.commands import accept_items, changed_event, connector_principal, queue_run, run_event
from contentsvc.connectors.credentials import open_credential
from contentsvc.connectors.health import moved
from contentsvc.connectors.kinds import FIXTURE, FIXTURE_KIND, ROLE_PREFIX, ServedKind, served_by
from contentsvc.connectors.pages import Page, RunFailure, check_page, fixture_fetch
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Part
from contentsvc.readmodel.uploads import read_upload_secret
from contentsvc.journal.store import append
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.plugins.client import PluginClient, PluginClients, PluginFailed, PluginUnreachable, backoff_delay
from contentsvc.plugins.plans import ActivePlan
from contentsvc.projectors.base import Projector, counted, oldest_due
from contentsvc.storage import sealed
from contentsvc.storage.database import database_now

log = get_logger("contentsvc.connectors")

UNREACHABLE_TRIES = 5  # decisions-part2 "Runs": plugin_unavailable after 5 tries for an active plugin
# (a run pinned to a plan no longer active has `pinned_plugin_attempts` and ends pinned_plugin_unavailable)
IDLE_POLL_SECONDS = 1.0
SWEEP_SECONDS = 60.0  # expired push replays and fingerprints go this often
BACKOFF_UNIT_SECONDS = 1.0


def unusable_answer(run: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """The outcome of a run whose plugin answer passed the checks but its page could not be used."""
    log.error("connector_run_error", run_id=run["run_id"], error=type(exc).__name__)
    return {"state": "failed", "error": {"code": "invalid_plugin_output",
                                         "message": f"the answer could not be used ({type(exc).__name__})"}}


class ConnectorsWorker(Projector):
    name = "connectors"
    # Connectors created, changed or asked to run, and plan changes; schedules are polled.
    wakes_on = ("connector", "plugin")
    runs_beside_steps = True  # runs commit their pages on the worker's connection between steps

    @staticmethod
    def waiting(conn: psycopg.Connection) -> str:
        queued, running, late = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'queued'), count(*) FILTER (WHERE state = 'running'),"
            " now() - min(run_at) FILTER (WHERE state = 'queued' AND run_at <= now())"
            " FROM connector_runs WHERE state IN ('queued', 'running')").fetchone()
        return f"{counted(queued, 'run')} queued{oldest_due(late)}, {running:,} running"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.plan = ActivePlan(settings)
        self._clients = PluginClients()
        self.backoff_unit = BACKOFF_UNIT_SECONDS
        # Runs proceed side by side (plugin calls overlap); their statements take turns on the one
        # connection the runner gives the worker.
        self._db = asyncio.Lock()
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._swept = 0.0  # monotonic time of the last sweep of expired push replays and fingerprints
        self._grant_secret: bytes | None = None  # the presigned URLs' key, read once

    @classmethod
    def from_settings(cls, settings: Settings) -> "ConnectorsWorker":
        return cls(settings)

    def idle_poll_seconds(self) -> float | None:
        return IDLE_POLL_SECONDS  # schedules come due with no commit to wake the worker

    async def open(self, conn: AsyncConnection) -> None:
        self._cancel_runs()  # after a reconnection: their connection is gone; they are queued again below
        # A run a killed worker left running is queued again: its checkpoint is its last committed page's.
        # Its Connector is locked first, as a command locks it, so a run request committing meanwhile
        # is seen here rather than met on the one-queued-run index.
        await conn.execute("SELECT 1 FROM connectors WHERE connector_id IN (SELECT connector_id FROM connector_runs"
                           " WHERE state = 'running') ORDER BY connector_id FOR UPDATE")
        await conn.execute("UPDATE connector_runs SET state = 'queued' WHERE state = 'running'"
                           " AND NOT EXISTS (SELECT 1 FROM connector_runs q WHERE q.connector_id ="
                           " connector_runs.connector_id AND q.state = 'queued')")
        await conn.execute("UPDATE connector_runs SET state = 'skipped', notice = 'run_in_progress',"
                           " finished_at = now() WHERE state = 'running'")
        await conn.commit()

    def _cancel_runs(self) -> None:
        for task in self._runs.values():
            task.cancel()
        self._runs.clear()

    async def close(self) -> None:
        self._cancel_runs()
        await self._clients.aclose()

    async def step(self, conn: AsyncConnection) -> bool:
        """With runs in flight, wait for the first to end (at most the idle poll); then collect the
        runs that ended, queue what the schedules made due, start runs up to `run_concurrency`
        (each a task that outlives the step), check new credentials, and once a minute sweep
        expired push replays and fingerprints. True while runs are in flight."""
        if self._runs:
            # The runs' statements share the runner's connection, which its wait for a commit would
            # hold for the whole idle poll: so with runs in flight, the wait is here, on the runs,
            # and the runner steps again at once (commits meanwhile stay queued for its next wait).
            await asyncio.wait(self._runs.values(), timeout=IDLE_POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
        self._collect_ended_runs()
        started = []
        async with self._db:
            await self.plan.refresh_if_due(conn)
            await conn.commit()
            await self.queue_scheduled(conn)
            while len(self._runs) + len(started) < self.settings.connectors.run_concurrency:
                run = await self.start_next(conn)
                if run is None:
                    break
                started.append(run)
            if time.monotonic() >= self._swept + SWEEP_SECONDS:
                await push_store.sweep(conn)
                self._swept = time.monotonic()
        for run in started:
            self._runs[run["run_id"]] = asyncio.create_task(self.carry_out(conn, run))
        await self.check_credentials(conn)
        return bool(self._runs)

    def _collect_ended_runs(self) -> None:
        for run_id, task in list(self._runs.items()):
            if task.done():
                del self._runs[run_id]
                if not task.cancelled() and task.exception() is not None:
                    log.error("connector_run_stopped", run_id=run_id, error=type(task.exception()).__name__)

    # ------------------------------------------------------------ credentials

    async def check_credentials(self, conn: AsyncConnection) -> None:
        """check_credential for each credential deposited or replaced since the last check: its
        `expires_at` (when the deposit named none) drives credential_expiring; a refusal of class
        `access` shows as access_error until a run or a new credential succeeds."""
        async with self._db:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM connectors WHERE enabled AND credential IS NOT NULL"
                              " AND credential_checked_version < credential_version ORDER BY connector_id LIMIT 20")
            due = await cur.fetchall()
            await conn.commit()
        for connector in due:
            served = self._served(connector)
            detail: dict[str, Any] | None = None
            expires_at = None
            if served is not None and served.provider is not None:
                try:
                    credential = open_credential(self.settings, connector["connector_id"],
                                                 connector["credential_version"], connector["credential"])
                    answer = await self._client(served).invoke(
                        "connector/check_credential", served.call_body(connector, credential, self.settings.connectors.public_base_url),
                        float(self.settings.connectors.fetch_timeout_seconds))
                    expires_at = answer.get("expires_at") if isinstance(answer.get("expires_at"), str) else None
                except PluginUnreachable:
                    continue  # tried again at the next step
                except PluginFailed as exc:
                    detail = {"code": exc.code, "message": exc.message[:1024], "error_class": exc.error_class}
                except sealed.Unreadable:
                    detail = {"code": "credential_unreadable", "message": "no configured key opens it"}
            async with self._db:
                await self._record_check(conn, connector["connector_id"], connector["credential_version"], detail,
                                         expires_at)

    async def _record_check(self, conn: AsyncConnection, connector_id: str, version: int,
                            detail: dict[str, Any] | None, expires_at: str | None) -> None:
        async with journal_transaction(conn):
            connector = await views.connector_row(conn, connector_id, lock=True)
            if connector["credential_version"] != version:
                return  # replaced meanwhile: the new one is checked next
            now = await database_now(conn)
            if expires_at is not None and connector["credential_expires_at"] is None:
                connector["credential_expires_at"] = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
            stored = dict(connector["health"])
            if detail is not None:
                stored["last_error_detail"] = {**detail, "at": iso(now)}
            connector["health"] = stored
            health = views.evaluated_health(connector, now)
            await conn.execute("UPDATE connectors SET credential_checked_version = %s, credential_expires_at = %s,"
                               " health = %s WHERE connector_id = %s",
                               (version, connector["credential_expires_at"], Jsonb(health), connector_id))
            if moved(stored, health):
                connector["health"] = health
                await append(conn, [changed_event(connector, "health", now)])

    # ------------------------------------------------------------ scheduling

    async def queue_scheduled(self, conn: AsyncConnection) -> int:
        """A `schedule` run for each enabled Connector whose next scheduled start has come."""
        async with journal_transaction(conn):
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT *, now() AS now FROM connectors WHERE enabled AND next_run_at <= now()"
                              " ORDER BY next_run_at LIMIT 100 FOR UPDATE SKIP LOCKED")
            due = await cur.fetchall()
            for row in due:
                now, slot = row["now"], row["next_run_at"]
                interval = timedelta(seconds=row["interval_seconds"])
                missed = int((now - slot) / interval)  # missed slots collapse into this one
                next_slot = slot + interval * (missed + 1)
                await conn.execute("UPDATE connectors SET last_scheduled_start = %s, next_run_at = %s"
                                   " WHERE connector_id = %s", (slot, next_slot, row["connector_id"]))
                queued = await conn.execute("SELECT 1 FROM connector_runs WHERE connector_id = %s"
                                            " AND state = 'queued'", (row["connector_id"],))
                if await queued.fetchone() is None:
                    # A source's retry_after_seconds defers the run it asked to wait for.
                    run_at = max(now, row["retry_after_until"] or now)
                    await queue_run(conn, row, "schedule", run_at, now)
        return len(due)

    async def start_next(self, conn: AsyncConnection) -> dict[str, Any] | None:
        async with journal_transaction(conn):
            cur = conn.cursor(row_factory=dict_row)
            # The run and its Connector, both or neither: a command holding the Connector (a disable
            # skipping its queued runs) is not waited for, which would hold the run it waits on.
            await cur.execute(
                "SELECT r.*, now() AS now FROM connector_runs r JOIN connectors c ON c.connector_id = r.connector_id"
                " WHERE r.state = 'queued' AND r.run_at <= now()"
                " AND NOT EXISTS (SELECT 1 FROM connector_runs o WHERE o.connector_id = r.connector_id"
                "                 AND o.state = 'running')"
                " ORDER BY r.run_at, r.run_id LIMIT 1 FOR UPDATE OF r, c SKIP LOCKED")
            run = await cur.fetchone()
            if run is None:
                return None
            now = run.pop("now")
            run.update(state="running", started_at=now, plan_id=self.plan.plan_id)
            await conn.execute("UPDATE connector_runs SET state = 'running', started_at = %s, plan_id = %s"
                               " WHERE run_id = %s", (now, run["plan_id"], run["run_id"]))
            await conn.execute("UPDATE connectors SET last_run_started_at = %s WHERE connector_id = %s",
                               (now, run["connector_id"]))
            await append(conn, [run_event(run, now)])
        return run

    # ------------------------------------------------------------ a run

    def _served(self, connector: dict[str, Any]) -> ServedKind | None:
        if connector["kind"] == FIXTURE:
            return ServedKind(FIXTURE_KIND, None) if self.settings.connectors.fixture_enabled else None
        return served_by(self.plan.provider(ROLE_PREFIX + connector["kind"]), connector["kind"])

    async def carry_out(self, conn: AsyncConnection, run: dict[str, Any]) -> None:
        async with self._db:
            connector = await views.connector_row(conn, run["connector_id"])
            await conn.commit()
        served = self._served(connector)
        outcome: dict[str, Any] = {"state": "succeeded"}
        try:
            if served is None:
                raise RunFailure("plugin_unavailable", f"no plugin of the active plan serves kind {connector['kind']!r}")
            credential = open_credential(self.settings, connector["connector_id"], connector["credential_version"],
                                         connector["credential"])
            max_pages = min(served.description.limits.max_pages_per_run, self.settings.connectors.max_pages_per_run)
            checkpoint = connector["checkpoint"]
            while True:
                if served.provider is not None:
                    async with self._db:
                        stopped = await self._stopped(conn, run, served)
                    if stopped:
                        raise RunFailure("pinned_plan_stopped", "a rollback stopped the work pinned to this run's plan")
                answer = await self.fetch(served, connector, credential, checkpoint, run)
                page = check_page(answer, checkpoint, served.description.max_items,
                                  served.description.limits.max_checkpoint_bytes)
                if page.not_due:
                    outcome = {"state": "skipped", "notice": "not_due"}
                    break
                attached = await self.attach(conn, served, connector, credential, page)
                async with self._db:
                    connector = await self.commit_page(conn, served, connector, run, page, attached)
                checkpoint = page.checkpoint
                if page.retry_after_seconds is not None:  # decisions-part2: defers the next run
                    outcome["retry_after"] = page.retry_after_seconds
                if page.notice is not None:
                    outcome["notice"] = page.notice
                    break
                if not connector["enabled"] or not page.more or run["pages"] >= max_pages:
                    break
        except RunFailure as failure:
            outcome = {"state": "failed", "error": failure.error(), "retry_after": failure.retry_after_seconds}
        except sealed.Unreadable:
            outcome = {"state": "failed", "error": {"code": "credential_unreadable",
                                                    "message": "no configured key opens the deposited credential"}}
        except psycopg.DataError as exc:  # a value of the answer the database cannot hold: the page's
            outcome = unusable_answer(run, exc)  # transaction rolled back, and so would every retry's
        except psycopg.Error:
            raise  # the database: the run stays `running` and is queued again when the worker reconnects
        except Exception as exc:  # an answer the checks let through but the page could not use
            outcome = unusable_answer(run, exc)
        async with self._db:
            await self.finish(conn, run, outcome)

    def _client(self, served: ServedKind) -> PluginClient:
        return self._clients.client(served.provider.target)

    async def _stopped(self, conn: AsyncConnection, run: dict[str, Any], served: ServedKind) -> bool:
        """Whether a rollback with `pinned_work: stop`, later than the run's plan, left out the
        registration the run calls (part 2, pinned work; the materializer's rule alike)."""
        cur = await conn.execute(
            "SELECT 1 FROM plugin_plans started JOIN plugin_plans q ON q.pinned_work = 'stop'"
            " AND q.created_at > started.created_at"
            " AND NOT q.roles @> jsonb_build_array(jsonb_build_object('registration_id', %s::text))"
            " WHERE started.plan_id = %s LIMIT 1", (served.provider.registration_id, run["plan_id"]))
        stopped = await cur.fetchone() is not None
        await conn.commit()
        return stopped

    async def fetch(self, served: ServedKind, connector: dict[str, Any], credential: dict | None,
                    checkpoint: Any, run: dict[str, Any]) -> Any:
        if served.provider is None:
            return fixture_fetch(connector["config"], checkpoint)
        client = self._client(served)
        body = {**served.call_body(connector, credential, self.settings.connectors.public_base_url), "checkpoint": checkpoint,
                "page_in_run": run["pages"], "reads_today": connector["reads_today"]}
        timeout = float(self.settings.connectors.fetch_timeout_seconds)
        # A run whose plan is no longer the active one is pinned work: its own budget and code.
        pinned = run["plan_id"] != self.plan.plan_id
        tries = self.settings.pinned_plugin_attempts if pinned else UNREACHABLE_TRIES
        for attempt in range(tries):
            try:
                return await client.invoke("connector/fetch", body, timeout)
            except PluginFailed as exc:
                if exc.retryable and exc.error_class == "transient" and attempt + 1 < tries \
                        and exc.retry_after_seconds is None:
                    await asyncio.sleep(backoff_delay(attempt, self.backoff_unit))
                    continue
                raise RunFailure(exc.code, exc.message, exc.error_class, exc.retry_after_seconds) from None
            except PluginUnreachable as exc:
                if attempt + 1 == tries:
                    raise RunFailure("pinned_plugin_unavailable" if pinned else "plugin_unavailable",
                                     str(exc)) from None
                await asyncio.sleep(backoff_delay(attempt, self.backoff_unit))
        raise AssertionError("unreachable")

    async def attach(self, conn: AsyncConnection, served: ServedKind, connector: dict[str, Any],
                     credential: dict | None, page: Page) -> dict[int, list[Part]]:
        """The Blob Parts of each item's attachments, by item index (connectors/attachments.py). An
        item with attachments from a kind that declares none breaks the protocol: it is rejected."""
        attached: dict[int, list[Part]] = {}
        declared = served.description.attachments

        async def invoke(route: str, body: dict[str, Any]) -> Any:
            try:
                return await self._client(served).invoke(route, body,
                                                         float(self.settings.connectors.fetch_timeout_seconds))
            except PluginFailed as exc:
                raise RunFailure(exc.code, exc.message, exc.error_class, exc.retry_after_seconds) from None
            except PluginUnreachable as exc:
                raise RunFailure("plugin_unavailable", str(exc)) from None

        async def on_db(step):
            async with self._db:
                try:
                    result = await step(conn)
                    await conn.commit()
                    return result
                except BaseException:
                    await conn.rollback()
                    raise

        for n, item in enumerate(page.items):
            if n in page.rejected or item.get("withdraw") is True or not item.get("attachments"):
                continue
            if declared is None or served.provider is None:
                page.rejected.append(n)
                continue
            common = served.call_body(connector, credential, self.settings.connectors.public_base_url)
            parts, extensions = await blob_parts(invoke, on_db, common, connector_principal(connector),
                                                 connector["connector_id"], item, declared.max_bytes,
                                                 await self._grants(conn))
            if extensions:
                item["extensions"] = {**(item.get("extensions") or {}), **extensions}
            attached[n] = parts
        return attached

    async def _grants(self, conn: AsyncConnection) -> Grants:
        """Presigned grants point at the API as clients reach it (the supervisor tells every process
        where the API listens); the URL key is the API's."""
        if self._grant_secret is None:
            async with self._db:
                self._grant_secret = await read_upload_secret(conn)
                await conn.commit()
        return Grants(self.settings.public_base_url(), self._grant_secret, self.settings.upload_url_ttl_seconds)

    async def commit_page(self, conn: AsyncConnection, served: ServedKind, connector: dict[str, Any],
                          run: dict[str, Any], page: Page, attached: dict[int, list[Part]]) -> dict[str, Any]:
        """The page's Receipts, checkpoint, counters and run row in one transaction; the Connector
        as it is after it (`enabled` false when disabled meanwhile)."""
        async with journal_transaction(conn):
            current = await views.connector_row(conn, connector["connector_id"], lock=True)
            results = await accept_items(conn, served, connector, page.items, page.rejected, attached)
            created = sum(1 for r in results if isinstance(r, Accepted) and not r.replayed)
            rejected = sum(1 for r in results if isinstance(r, ApiError))
            now = await database_now(conn)
            run["pages"] += 1
            run["items_seen"] += len(page.items)
            run["receipts_created"] += created
            run["items_rejected"] += rejected
            await conn.execute(
                "UPDATE connector_runs SET pages = %s, items_seen = %s, receipts_created = %s, items_rejected = %s"
                " WHERE run_id = %s", (run["pages"], run["items_seen"], run["receipts_created"], run["items_rejected"],
                                       run["run_id"]))
            same_day = current["usage_day"] == now.date()
            health = dict(current["health"])
            if page.diagnostics is not None:
                health["diagnostics"] = page.diagnostics
            if page.push is not None:
                health["push"] = {k: v for k, v in page.push.items() if k in ("state", "error", "code", "message")}
            await conn.execute(
                "UPDATE connectors SET checkpoint = %s, last_item_at = CASE WHEN %s > 0 THEN %s ELSE last_item_at END,"
                " usage_day = %s, items_read_previous_day = %s, items_read_today = %s, reads_today = %s,"
                " health = %s WHERE connector_id = %s",
                (Jsonb(page.checkpoint), created, now, now.date(),
                 current["items_read_previous_day"] if same_day else (
                     current["items_read_today"] if current["usage_day"] == now.date() - timedelta(days=1) else 0),
                 (current["items_read_today"] if same_day else 0) + len(page.items),
                 (current["reads_today"] if same_day else 0) + page.reads, Jsonb(health), connector["connector_id"]))
            await append(conn, [run_event(run, now)])
        log.info("connector_page", run_id=run["run_id"], connector_id=connector["connector_id"], page=run["pages"],
                 items=len(page.items), receipts_created=created, items_rejected=rejected)
        return dict(current, checkpoint=page.checkpoint)

    async def finish(self, conn: AsyncConnection, run: dict[str, Any], outcome: dict[str, Any]) -> None:
        async with journal_transaction(conn):
            connector = await views.connector_row(conn, run["connector_id"], lock=True)
            now = await database_now(conn)
            run.update(state=outcome["state"], finished_at=now, error=outcome.get("error"),
                       notice=outcome.get("notice"))
            await conn.execute("UPDATE connector_runs SET state = %s, finished_at = %s, error = %s, notice = %s"
                               " WHERE run_id = %s",
                               (run["state"], now, None if run["error"] is None else Jsonb(run["error"]),
                                run["notice"], run["run_id"]))
            stored = dict(connector["health"])
            if run["state"] == "succeeded":
                connector["last_success_at"] = now
                stored.pop("last_error_detail", None)
            elif run["state"] == "failed":
                stored["last_error_detail"] = {**run["error"], "at": iso(now)}
            connector["health"] = stored
            health = views.evaluated_health(connector, now)
            retry_after = outcome.get("retry_after")
            await conn.execute(
                "UPDATE connectors SET health = %s, last_success_at = %s,"
                " retry_after_until = CASE WHEN %s::int IS NULL THEN retry_after_until"
                "                     ELSE %s + make_interval(secs => %s::int) END WHERE connector_id = %s",
                (Jsonb(health), connector["last_success_at"], retry_after, now, retry_after, run["connector_id"]))
            events = [run_event(run, now)]
            if moved(stored, health):
                connector["health"] = health
                events.append(changed_event(connector, "health", now))
            await append(conn, events)
        log.info("connector_run", run_id=run["run_id"], connector_id=run["connector_id"], state=run["state"],
                 pages=run["pages"], items_seen=run["items_seen"], receipts_created=run["receipts_created"],
                 items_rejected=run["items_rejected"], error_code=(run["error"] or {}).get("code"))
