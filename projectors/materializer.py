"""Materializer: accepted commands become Versions, and Receipts resolve.

Input: ingest.accepted, withdrawal.accepted. Output (appended to the
journal, with the checkpoint, in one transaction): record.accepted,
record.availability_changed, record.withdrawn, receipt.resolved.

Its decisions need a consistent view of every identity's current Version,
so it keeps that state itself (materializer_identities), written in the
same transaction: created when the normalized content is new, duplicate
when it equals the current Version's, conflict after a withdrawal.

Blob content goes through the built-in text path: the Blob's bytes are read
from the blob store and checked against the SHA-256 and size verified at
acceptance (carried by ingest.accepted), decoded with the charset of the
media type and published as a text Part. A Blob that is no longer the
verified input (missing, altered) quarantines the Version with
`input_unverified`; bytes the text path cannot read quarantine it with
`normalizer_failed`. Either way the Receipt resolves `created` with the
diagnostic, and the quarantined Version keeps the Blob reference as its
manifest. What is decided goes into the events appended in the batch's
transaction, so a crash before the commit decides again from scratch.

A Blob whose media type the active plan routes to a normalizer plugin is sent
to it instead (part 2, normalizer request), but never from inside a
transaction: the Version first waits, as a row of materializer_deferred
written with the checkpoint, that records the plan and registration it
started under (pinned work), the Record and Version ids its requests carry,
and when to try (at once). Attempts run as tasks beside the fold, so a slow
plugin holds neither a transaction nor any other Version; each finished
attempt is settled in a transaction of its own under the checkpoint's lock
(projectors/normalizer_calls.py has the rules: published, quarantined with a
diagnostic naming plugin, contribution and invocation, or waiting again
with backoff 1, 2, 4 ... 60 s). The answer is journaled as the Version's
manifest in record.accepted, so a replay never calls the plugin again, and
a crash mid-call leaves the row, so the Version is attempted again and
published once. A newer command of the same identity settles a waiting
revision first: a newer ingest supersedes it (`normalization_superseded`),
a withdrawal makes it a conflict (`record_withdrawn`), as if the two had
been in one batch.

Currentness is not decided here: a new Version reads `is_current: false`
until the lexical projector publishes it `retrieval_ready` (part 1, "States
and transitions": a Version still building reports `is_current` false until
it becomes current); the Record's previous Version serves until then. A
revision followed in the same batch by a newer revision of its identity
(a newer revision was accepted before it was normalized) is not normalized:
it is quarantined with `normalization_superseded` and is never current
(part 1, Diagnostic). The identities keep, as `current`, the newest Version
that can serve: a quarantined Version never replaces it, so text equal to
the Record's serving text stays a duplicate.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from contentsvc.projectors import currentness
from contentsvc.projectors.base import TableFold
from contentsvc.projectors.normalizer_calls import (
    NotNow,
    Pin,
    Publish,
    Quarantine,
    RoutedPart,
    Wait,
    attempt,
    diagnostic,
    normalizer_request,
    settle,
)
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from contentsvc.config import MAX_TEXT_BLOB_BYTES, Settings
from contentsvc.journal import checkpoints
from contentsvc.journal.store import read_at
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.plugins import registry
from contentsvc.plugins.client import PluginClient, PluginClients, random_backoff_delay
from contentsvc.plugins.plans import ActivePlan, PlanSnapshot, Provider, load_plan
from contentsvc.domain.normalize import (
    TextPathError,
    blob_text,
    build_manifest,
    manifest_digest,
    text_route_refusal,
)
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import append
from contentsvc.storage.blobstore import BlobStore, FilesystemBlobStore, read_chunks

log = get_logger("contentsvc.projectors.materializer")

MAX_CALLS_IN_FLIGHT = 16  # attempts at waiting Versions running at once beside the fold
IN_FLIGHT_POLL_SECONDS = 0.05  # how soon the runner looks again while attempts are in flight

NORMALIZATION_SUPERSEDED_DIAGNOSTIC = {
    "code": "normalization_superseded",
    "message": "A newer revision of this source identity was accepted before this one was normalized; "
               "the normalizer was not invoked and this Version is never current.",
    "retryable": False,
}
RECORD_WITHDRAWN_DIAGNOSTIC = {
    "code": "record_withdrawn",
    "message": "The Record was withdrawn; its identity accepts no new Versions.",
    "retryable": False,
}


@dataclass
class Identity:
    record_id: str
    current_version_id: str | None
    current_digest: bytes | None
    withdrawn: bool


def _key(e: JournalEvent) -> tuple[str, str, str, str]:
    s = e.payload.source
    return (e.org_id, s.corpus_id, s.namespace, s.record_key)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Deferred(Exception):
    """The Version waits for a normalizer plugin: for its first attempt (`answers` empty, due at
    once), or for another one."""

    def __init__(self, pin: Pin, cause: str, answers: dict[str, Any] | None = None, first: bool = False) -> None:
        super().__init__(cause)
        self.pin = pin
        self.cause = cause
        self.answers = answers or {}
        self.first = first
        self.ids: tuple[str, str] | None = None  # (record_id, version_id), set by _ingest


@dataclass
class Call:
    """One attempt at a waiting Version, running as a task beside the fold."""

    event: JournalEvent
    pin: Pin
    ids: tuple[str, str]
    routed: list[RoutedPart]
    recorded: dict[str, Any]
    task: asyncio.Task


def _superseded(commands: list[JournalEvent]) -> set[int]:
    """Positions of ingests followed, later in the batch, by another ingest of the same identity
    with no withdrawal between them: a newer revision was accepted before they were normalized."""
    out: set[int] = set()
    newer: set[tuple] = set()  # identities with a later ingest and no withdrawal since
    for e in reversed(commands):
        key = _key(e)
        if e.kind == ev.WITHDRAWAL_ACCEPTED:
            newer.discard(key)
        elif key in newer:
            out.add(e.position)
        else:
            newer.add(key)
    return out


def _blob_parts(e: JournalEvent) -> list[dict[str, Any]]:
    return [part["content"] for part in build_manifest(e.payload.content, e.payload.title)["parts"]
            if part["content"]["kind"] == "blob"]


class MaterializerProjector(TableFold):
    name = "materializer"
    rests_in_ingest_bursts = True  # on the way to searchable (runner.IngestBurst)
    reads = frozenset({ev.INGEST_ACCEPTED, ev.WITHDRAWAL_ACCEPTED})  # the commands it materializes
    # Its append carries each Version's text and holds the journal lock, every other append
    # waiting (27 ms at the median with 1,000 under batch ingest): half the usual step, and a
    # fifth of that while ingests keep arriving (15-76 ms with 300-1,500 events held every single
    # ingest behind it; docs/decisions.md, "Folds rest in bursts of ingests").
    batch_size = 500
    contended_batch_size = 100

    def __init__(self, blob_root: Path, settings: Settings | None = None) -> None:
        self.blob_root = blob_root
        self.settings = settings or Settings(home=blob_root.parent)
        self._blob_store: BlobStore | None = None
        self.plan = ActivePlan(self.settings)
        self._clients = PluginClients()
        self._plans: dict[str, PlanSnapshot | None] = {}  # plan_id -> the plan pinned work calls through
        self._calls: dict[str, Call] = {}  # receipt_id -> its attempt in flight

    @classmethod
    def from_settings(cls, settings: Settings) -> "MaterializerProjector":
        return cls(settings.blob_root, settings)  # CONTENTSVC_HOME/blobs, as the API writes them

    async def open(self, conn: AsyncConnection) -> None:
        await super().open(conn)
        # A start (or a reconnection) tries every waiting Version at once: it often follows the
        # operator bringing the plugin back, and the backoff's attempt counts are kept.
        async with conn.transaction():
            await conn.execute("UPDATE materializer_deferred SET next_attempt_at = now() WHERE next_attempt_at > now()")

    @property
    def blob_store(self) -> BlobStore:
        if self._blob_store is None:  # opened on the first Blob to read
            self._blob_store = FilesystemBlobStore(self.blob_root)
        return self._blob_store

    def idle_poll_seconds(self) -> float | None:
        # Attempts in flight end without a journal commit to wake the runner: look again soon.
        return IN_FLIGHT_POLL_SECONDS if self._calls else None

    async def step(self, conn: AsyncConnection) -> bool:
        more = await super().step(conn)
        more = await self._settle_calls(conn) or more
        more = await self._start_calls(conn) or more
        if not more and self._calls:
            # Nothing else to do: give the attempts in flight a moment, so that those ending
            # together are settled together (one commit) and none waits for the runner's poll.
            done, _ = await asyncio.wait([call.task for call in self._calls.values()],
                                         timeout=IN_FLIGHT_POLL_SECONDS)
            more = bool(done)
        return more

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        commands = [e for e in events if e.kind in self.reads]  # an operator's replay passes every kind
        if not commands:
            return
        await self.plan.refresh_if_due(conn)
        keys = {_key(e) for e in commands}
        identities = await self._load(conn, keys)
        superseded = _superseded(commands)
        touched: set[tuple] = set()
        out: list[NewEvent] = []
        # A deferred revision of an identity this batch touches is settled first, in journal order.
        waiting = await self._deferred_of(conn, keys)
        for e in commands:
            key = _key(e)
            earlier = waiting.pop(key, None)
            if earlier is not None:
                out.extend(await self._settle_overtaken(conn, earlier, e, identities, key))
            if e.kind == ev.INGEST_ACCEPTED:
                try:
                    out.extend(await self._ingest(e, identities, key, e.position in superseded))
                except Deferred as wait:
                    await self._defer(conn, e, key, wait)
            else:
                out.extend(self._withdraw(e, identities, key))
            touched.add(key)
        await self._save(conn, {k: identities[k] for k in touched if k in identities})
        await append(conn, out)

    # ------------------------------------------------------------ waiting Versions

    async def _deferred_of(self, conn: AsyncConnection, keys: set[tuple]) -> dict[tuple, tuple[str, int]]:
        """identity -> (receipt_id, position) of its deferred revision (at most one: a newer settles it)."""
        orgs, corpora, namespaces, record_keys = (list(c) for c in zip(*keys))
        cur = await conn.execute(
            "SELECT d.org_id, d.corpus_id, d.namespace, d.record_key, d.receipt_id, d.position"
            " FROM materializer_deferred d"
            " JOIN unnest(%b::text[], %b::text[], %b::text[], %b::text[]) AS k(o, c, n, r)"
            "   ON d.org_id = k.o AND d.corpus_id = k.c AND d.namespace = k.n AND d.record_key = k.r",
            (orgs, corpora, namespaces, record_keys))
        return {tuple(r[:4]): (r[4], r[5]) for r in await cur.fetchall()}

    async def _settle_overtaken(self, conn: AsyncConnection, earlier: tuple[str, int], newer: JournalEvent,
                                identities: dict, key: tuple) -> list[NewEvent]:
        receipt_id, position = earlier
        await conn.execute("DELETE FROM materializer_deferred WHERE receipt_id = %s", (receipt_id,))
        e = (await read_at(conn, [position]))[position]
        if newer.kind == ev.INGEST_ACCEPTED:  # a newer revision before this one was normalized
            return await self._ingest(e, identities, key, True)
        state = identities.get(key)
        record_id = state.record_id if state else new_id("rec")
        identities.setdefault(key, Identity(record_id, None, None, False))
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=receipt_id)
        return [self._resolved(common, "conflict", record_id, None, [RECORD_WITHDRAWN_DIAGNOSTIC])]

    async def _defer(self, conn: AsyncConnection, e: JournalEvent, key: tuple, wait: Deferred) -> None:
        pin = wait.pin
        delay = 0.0 if wait.first else random_backoff_delay(pin.attempts)
        if not wait.first:
            log.warning("normalization_deferred", receipt_id=e.payload.receipt_id, plan_id=pin.plan_id,
                        registration_id=pin.registration_id, attempts=pin.attempts, retry_in_s=round(delay, 1),
                        cause=wait.cause)
        record_id, version_id = wait.ids
        await conn.execute(
            "INSERT INTO materializer_deferred (receipt_id, org_id, corpus_id, namespace, record_key, position,"
            " plan_id, registration_id, attempts, budget_spent, next_attempt_at, last_error, record_id, version_id,"
            " answers)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (receipt_id) DO UPDATE SET attempts = EXCLUDED.attempts,"
            " budget_spent = EXCLUDED.budget_spent, next_attempt_at = EXCLUDED.next_attempt_at,"
            " last_error = EXCLUDED.last_error, answers = EXCLUDED.answers",
            (e.payload.receipt_id, *key, e.position, pin.plan_id, pin.registration_id, pin.attempts,
             pin.budget_spent, datetime.now(timezone.utc) + timedelta(seconds=delay), wait.cause[:1024],
             record_id, version_id, Jsonb(wait.answers)))

    async def _start_calls(self, conn: AsyncConnection) -> bool:
        """Starts an attempt for each waiting Version that is due, beside the fold: no plugin call
        runs inside a transaction, and a slow plugin holds up nothing but its own Versions. Work a
        rollback stopped (part 2: `pinned_work` "stop") is settled at once instead."""
        free = MAX_CALLS_IN_FLIGHT - len(self._calls)
        if free <= 0:
            return False
        async with journal_transaction(conn):
            cur = await conn.execute(
                "SELECT d.receipt_id, d.position, d.plan_id, d.registration_id, d.attempts, d.budget_spent,"
                "       d.record_id, d.version_id, d.answers, stop.plan_id"
                " FROM materializer_deferred d"
                " JOIN plugin_plans started ON started.plan_id = d.plan_id"
                " LEFT JOIN LATERAL (SELECT q.plan_id FROM plugin_plans q WHERE q.pinned_work = 'stop'"
                "   AND q.created_at > started.created_at"
                "   AND NOT q.roles @> jsonb_build_array(jsonb_build_object('registration_id', d.registration_id))"
                "   ORDER BY q.created_at LIMIT 1) stop ON true"
                " WHERE (d.next_attempt_at <= now() OR stop.plan_id IS NOT NULL) AND NOT d.receipt_id = ANY(%s::text[])"
                " ORDER BY d.position LIMIT %s",
                (list(self._calls), free))
            due = await cur.fetchall()
            settled: list[NewEvent] = []
            accepted = await read_at(conn, [row[1] for row in due])
            for receipt_id, position, plan_id, registration_id, attempts, spent, record_id, version_id, answers, stop \
                    in due:
                e = accepted[position]
                pin = Pin(plan_id, registration_id, attempts, spent)
                ids = (record_id or new_id("rec"), version_id or new_id("ver"))
                plan = await self._pinned_plan(conn, plan_id)
                if stop is not None or plan is None:
                    settled.extend(await self._publish(conn, e, pin, ids, stopped=diagnostic(
                        "pinned_plan_stopped", f"Rollback plan {stop} stopped the work pinned to plan {plan_id} "
                        f"(registration {registration_id}) before the normalizer answered.", None, None)
                        if stop is not None else diagnostic(
                        "pinned_plugin_unavailable", f"Plan {plan_id}, which this work is pinned to, is not in "
                        "the registry.", None, None)))
                    continue
                routed = self._routed(e, plan, ids)
                if not routed:  # no Blob left for a plugin (not verified): the built-in path decides
                    settled.extend(await self._publish(conn, e, pin, ids, decision=Publish(parts={})))
                    continue
                task = asyncio.create_task(attempt(routed, self._client,
                                                   lambda blob_id, e=e: self._unverified(e, blob_id)))
                self._calls[receipt_id] = Call(e, pin, ids, routed, answers or {}, task)
            if settled:
                await checkpoints.position(conn, self.name, for_update=True)
                await append(conn, settled)
        return bool(settled)

    async def _settle_calls(self, conn: AsyncConnection) -> bool:
        """Commits what the finished attempts decided, under the checkpoint's lock (a replay does
        not interleave). An attempt whose Version was settled meanwhile (a newer command of its
        identity, a rollback's stop) is dropped."""
        done = [(rid, call) for rid, call in self._calls.items() if call.task.done()]
        if not done:
            return False
        for rid, _ in done:
            del self._calls[rid]
        async with journal_transaction(conn):
            await checkpoints.position(conn, self.name, for_update=True)
            await self.plan.refresh_if_due(conn)
            out: list[NewEvent] = []
            for receipt_id, call in done:
                cur = await conn.execute("SELECT 1 FROM materializer_deferred WHERE receipt_id = %s FOR UPDATE",
                                         (receipt_id,))
                if await cur.fetchone() is None:
                    continue
                try:
                    outcomes = call.task.result()
                except Exception as exc:  # a defect of the attempt, not an answer: try again later
                    log.error("normalization_attempt_failed", receipt_id=receipt_id, error=type(exc).__name__)
                    outcomes = [NotNow("unreachable", f"the attempt failed: {type(exc).__name__}", "")
                                for _ in call.routed]
                decision = settle(call.pin, call.routed, outcomes, call.recorded,
                                  call.pin.plan_id == self.plan.plan_id, self.settings.pinned_plugin_attempts)
                if isinstance(decision, Wait):
                    wait = Deferred(decision.pin, decision.cause, decision.answers)
                    wait.ids = call.ids
                    await self._defer(conn, call.event, _key(call.event), wait)
                    continue
                out.extend(await self._publish(conn, call.event, call.pin, call.ids, decision=decision))
            await append(conn, out)
        return True

    async def _publish(self, conn: AsyncConnection, e: JournalEvent, pin: Pin, ids: tuple[str, str],
                       decision: Publish | Quarantine | None = None, stopped: dict[str, Any] | None = None
                       ) -> list[NewEvent]:
        """The events of a waiting Version that is settled; its row goes in the same transaction."""
        key = _key(e)
        identities = await self._load(conn, {key})
        out = await self._ingest(e, identities, key, False, pin, stopped=stopped, decision=decision, ids=ids)
        await conn.execute("DELETE FROM materializer_deferred WHERE receipt_id = %s", (e.payload.receipt_id,))
        if key in identities:
            await self._save(conn, {key: identities[key]})
        return out

    async def _pinned_plan(self, conn: AsyncConnection, plan_id: str) -> PlanSnapshot | None:
        if plan_id not in self._plans:  # plans are immutable: loaded once
            plan = await registry.plan(conn, plan_id)
            self._plans[plan_id] = await load_plan(conn, self.settings, plan) if plan is not None else None
        return self._plans[plan_id]

    def _routed(self, e: JournalEvent, plan: PlanSnapshot, ids: tuple[str, str]) -> list[RoutedPart]:
        """The Version's Blob Parts the plan routes to a normalizer plugin, with their requests."""
        p = e.payload
        out: list[RoutedPart] = []
        for content in _blob_parts(e):
            provider = plan.normalizer_for(content["media_type"])
            verified = (p.blobs or {}).get(content["blob_id"])
            if provider is None or verified is None:
                continue  # the built-in text path (or input_unverified) when published
            media_type = content["media_type"].split(";")[0].strip().lower()
            optional = any(r.media_type == media_type and r.optional for r in provider.settings.routes)
            out.append(RoutedPart(content["blob_id"], provider, optional, normalizer_request(
                org_id=e.org_id, corpus_id=p.source.corpus_id, namespace=p.source.namespace,
                record_key=p.source.record_key, receipt_id=p.receipt_id, record_id=ids[0], version_id=ids[1],
                blob_id=content["blob_id"], media_type=content["media_type"], size_bytes=verified.size_bytes,
                sha256=verified.sha256, url=self.blob_store.path_for(verified.storage_key).resolve().as_uri(),
                provider=provider, extensions=p.extensions, provenance=p.provenance)))
        return out

    def _client(self, provider: Provider) -> PluginClient:
        return self._clients.client(provider.target)

    def _unverified(self, e: JournalEvent, blob_id: str) -> str | None:
        verified = (e.payload.blobs or {}).get(blob_id)
        try:
            self._verified_bytes(verified, blob_id, keep=False)
        except TextPathError as exc:
            return str(exc.message)
        return None

    # ------------------------------------------------------------ ingest

    async def _ingest(self, e: JournalEvent, identities: dict, key: tuple, superseded: bool,
                      pin: Pin | None = None, stopped: dict[str, Any] | None = None,
                      decision: Publish | Quarantine | None = None, ids: tuple[str, str] | None = None
                      ) -> list[NewEvent]:
        p = e.payload
        state = identities.get(key)
        receipt_id = p.receipt_id
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=receipt_id)
        if state is not None and state.withdrawn:
            return [self._resolved(common, "conflict", state.record_id, None, [RECORD_WITHDRAWN_DIAGNOSTIC])]
        record_id, version_id = ids or (state.record_id if state else new_id("rec"), new_id("ver"))
        language, extensions = None, p.extensions
        if superseded or stopped:  # the normalizer is not invoked: the manifest stays as accepted
            manifest = build_manifest(p.content, p.title)
            diagnostics, quarantined = [stopped or NORMALIZATION_SUPERSEDED_DIAGNOSTIC], True
        else:
            try:
                manifest, diagnostics, quarantined = self._normalize(e, decision)
            except Deferred as wait:  # fix the ids its requests carry and the identity's Record
                wait.ids = (record_id, version_id)
                identities[key] = state or Identity(record_id, None, None, False)
                raise
            if isinstance(decision, Publish):
                language = decision.language
                if decision.extensions:
                    extensions = {**(extensions or {}), **decision.extensions}
        digest = manifest_digest(manifest)
        # Text equal to the serving Version's is a duplicate, superseded or not (decided without a normalizer).
        if state is not None and state.current_digest == digest:
            return [self._resolved(common, "duplicate", state.record_id, state.current_version_id, [])]
        previous = state.current_version_id if state else None
        if quarantined:  # never current, so the identity's serving Version stays
            identities[key] = state or Identity(record_id, None, None, False)
        else:
            identities[key] = Identity(record_id, version_id, digest, False)
        out = [
            NewEvent(
                subject_type="record",
                subject_id=record_id,
                version_id=version_id,
                payload=ev.RecordAccepted(
                    record_id=record_id,
                    version_id=version_id,
                    receipt_id=receipt_id,
                    source=p.source,
                    manifest=manifest,
                    provenance=p.provenance,
                    extensions=extensions,
                    relations=p.relations,
                    accepted_at=p.accepted_at,
                    created_at=_now(),
                    previous_version_id=previous,
                    diagnostics=diagnostics,
                    quarantined=quarantined,
                    language=language,
                ),
                **common,
            ),
            self._resolved(common, "created", record_id, version_id, diagnostics),
        ]
        # Not current yet: the lexical projector moves currentness once the Version can serve.
        out.insert(1, currentness.availability_event(out[0], "quarantined" if quarantined else "materialized"))
        return out

    def _normalize(self, e: JournalEvent, decision: Publish | Quarantine | None
                   ) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
        """The Version's manifest, its diagnostics and whether it is quarantined. Blob Parts become
        text Parts: by what the plugin answered (`decision`, for the Parts a plugin serves), else
        the built-in text path; or the Version is quarantined (manifest as accepted). Without a
        decision, a Blob the active plan routes to a plugin makes the Version wait (Deferred)."""
        p = e.payload
        manifest = build_manifest(p.content, p.title)
        if not any(part["content"]["kind"] == "blob" for part in manifest["parts"]):
            return manifest, [], False
        if isinstance(decision, Quarantine):
            return manifest, [decision.diagnostic], True
        if decision is None:
            routed = [provider for c in _blob_parts(e) if (p.blobs or {}).get(c["blob_id"]) is not None
                      and (provider := self.plan.normalizer_for(c["media_type"])) is not None]
            if routed:
                raise Deferred(Pin(self.plan.plan_id, routed[0].registration_id), "waiting for the normalizer's "
                               "first answer", first=True)
        served = decision.parts if decision is not None else {}
        parts = []
        for part in manifest["parts"]:
            content = part["content"]
            if content["kind"] != "blob":
                parts.append(part)
            elif served.get(content["blob_id"]) is not None:
                parts.extend(served[content["blob_id"]])
            else:
                try:
                    text = self._blob_text((p.blobs or {}).get(content["blob_id"]), content)
                except TextPathError as exc:
                    # An optional route's fallback that the text path cannot read keeps the plugin's code.
                    listed = [d for d in (decision.listed if decision else []) if d["code"] != "normalizer_conflict"]
                    return manifest, listed[:1] or [exc.diagnostic()], True
                parts.append({**part, "content": {"kind": "text", "text": text}})
        keys = [part["key"] for part in parts]
        if len(set(keys)) != len(keys):
            return manifest, [{"code": "normalizer_invalid_output", "retryable": False,
                               "message": "The normalizer's Parts reuse a key of another Part of the Version."}], True
        return {"parts": parts}, list(decision.listed) if decision is not None else [], False

    def _verified_bytes(self, verified: ev.VerifiedBlob | None, blob_id: str, keep: bool) -> bytes:
        """The Blob's bytes (kept only when `keep`), checked against what was verified at acceptance."""
        if verified is None:
            raise TextPathError("input_unverified", f"Blob {blob_id} was not a verified input at acceptance.")
        h, chunks, size = hashlib.sha256(), [], 0
        try:
            with self.blob_store.open_read(verified.storage_key) as reader:
                for chunk in read_chunks(reader):
                    size += len(chunk)
                    if size > verified.size_bytes:
                        break
                    h.update(chunk)
                    if keep:
                        chunks.append(chunk)
        except (OSError, ValueError) as exc:
            raise TextPathError("input_unverified", f"Blob {blob_id} cannot be read from the blob store "
                                f"({type(exc).__name__}).") from None
        if size != verified.size_bytes or h.hexdigest() != verified.sha256:
            raise TextPathError("input_unverified", f"Blob {blob_id} in the blob store is no longer the verified "
                                "input (its size or SHA-256 changed).")
        return b"".join(chunks)

    def _blob_text(self, verified: ev.VerifiedBlob | None, content: dict[str, Any]) -> str:
        blob_id, media_type = content["blob_id"], content["media_type"]
        if verified is None:
            raise TextPathError("input_unverified", f"Blob {blob_id} was not a verified input at acceptance.")
        refusal = text_route_refusal(media_type)
        if refusal is not None:
            raise TextPathError("normalizer_unrouted", refusal)
        if verified.size_bytes > MAX_TEXT_BLOB_BYTES:
            raise TextPathError("normalizer_failed", f"Blob {blob_id} has {verified.size_bytes} bytes; the built-in "
                                f"text path reads text Blobs of at most {MAX_TEXT_BLOB_BYTES} bytes.")
        return blob_text(self._verified_bytes(verified, blob_id, keep=True), media_type)

    def _withdraw(self, e: JournalEvent, identities: dict, key: tuple) -> list[NewEvent]:
        p = e.payload
        state = identities.get(key)
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=p.receipt_id)
        out: list[NewEvent] = []
        if state is None:
            state = Identity(new_id("rec"), None, None, False)
        if not state.withdrawn:
            state.withdrawn = True
            out.append(
                NewEvent(
                    subject_type="record",
                    subject_id=state.record_id,
                    version_id=state.current_version_id,
                    payload=ev.RecordWithdrawn(
                        record_id=state.record_id,
                        source=p.source,
                        current_version_id=state.current_version_id,
                        withdrawn_at=_now(),
                    ),
                    **common,
                )
            )
        identities[key] = state
        out.append(self._resolved(common, "withdrawal_applied", state.record_id, None, []))
        return out

    @staticmethod
    def _resolved(common: dict, outcome: str, record_id: str, version_id: str | None, diagnostics: list) -> NewEvent:
        return NewEvent(
            subject_type="receipt",
            subject_id=common["receipt_id"],
            version_id=version_id,
            payload=ev.ReceiptResolved(
                receipt_id=common["receipt_id"],
                outcome=outcome,
                record_id=record_id,
                version_id=version_id,
                diagnostics=diagnostics,
                resolved_at=_now(),
            ),
            **common,
        )

    @staticmethod
    async def _load(conn: AsyncConnection, keys: set[tuple]) -> dict[tuple, Identity]:
        if not keys:
            return {}
        orgs, corpora, namespaces, record_keys = (list(c) for c in zip(*keys))
        cur = await conn.execute(
            "SELECT m.org_id, m.corpus_id, m.namespace, m.record_key, m.record_id,"
            "       m.current_version_id, m.current_digest, m.withdrawn"
            " FROM materializer_identities m"
            " JOIN unnest(%b::text[], %b::text[], %b::text[], %b::text[]) AS k(o, c, n, r)"
            "   ON m.org_id = k.o AND m.corpus_id = k.c AND m.namespace = k.n AND m.record_key = k.r",
            (orgs, corpora, namespaces, record_keys),
        )
        return {tuple(r[:4]): Identity(r[4], r[5], r[6], r[7]) for r in await cur.fetchall()}

    @staticmethod
    async def _save(conn: AsyncConnection, states: dict[tuple, Identity]) -> None:
        keys = list(states)
        if not keys:
            return
        await conn.execute(
            "INSERT INTO materializer_identities (org_id, corpus_id, namespace, record_key, record_id,"
            " current_version_id, current_digest, withdrawn)"
            " SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],"
            "                      %b::bytea[], %b::bool[])"
            " ON CONFLICT (org_id, corpus_id, namespace, record_key) DO UPDATE SET"
            " current_version_id = EXCLUDED.current_version_id,"
            " current_digest = EXCLUDED.current_digest, withdrawn = EXCLUDED.withdrawn",
            [
                *(list(column) for column in zip(*keys)),
                [states[k].record_id for k in keys],
                [states[k].current_version_id for k in keys],
                [states[k].current_digest for k in keys],
                [states[k].withdrawn for k in keys],
            ],
        )
