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
to it instead (part 2, normalizer request: the Blob by `file://` reference,
its verified SHA-256 and size, an idempotency key stable across retries, an
invocation id per attempt); its answer becomes the Version's Parts, held to
the normalizer response rules. The answer is journaled as the Version's
manifest in record.accepted, so a replay never calls the plugin again. A
terminal error quarantines the Version with `normalizer_failed`, an answer
breaking the rules with `normalizer_invalid_output`, each diagnostic naming
plugin, contribution and invocation. A plugin that cannot answer now
(unreachable, or a retryable error) defers the Receipt: a row in
materializer_deferred, written with the checkpoint, records the plan and
registration it started under (pinned work) and when to try again (backoff
1, 2, 4 ... 60 s); the rest of the journal moves on meanwhile. Retryable
errors and timeouts spend the manifest's retry budget (`max_attempts`,
capped at 5), then quarantine (`normalizer_retries_exhausted`,
`normalizer_timeout`); an unreachable plugin of the active plan is retried
for as long as it takes, one of a plan no longer active up to
`pinned_plugin_attempts` (`pinned_plugin_unavailable`). A newer command of
the same identity settles a deferred revision first: a newer ingest
supersedes it (`normalization_superseded`), a withdrawal makes it a
conflict (`record_withdrawn`), as if the two had been in one batch.

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

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from contentsvc.projectors import currentness
from contentsvc.projectors.base import TableFold
from psycopg import AsyncConnection

from contentsvc.config import MAX_TEXT_BLOB_BYTES, Settings
from contentsvc.journal import checkpoints
from contentsvc.journal.store import read_after
from contentsvc.journal.store import transaction as journal_transaction
from contentsvc.logging import get_logger
from contentsvc.plugins.client import PluginClient, PluginFailed, PluginUnreachable, random_backoff_delay
from contentsvc.plugins.contract_check.normalizer import normalizer_response_schema
from contentsvc.plugins.plans import ActivePlan, Provider, load_provider
from contentsvc.domain.normalize import (
    TextPathError,
    blob_text,
    build_manifest,
    manifest_digest,
    nfc,
    text_route_refusal,
)
from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, NewEvent
from contentsvc.journal.store import append
from contentsvc.storage.blobstore import BlobStore, FilesystemBlobStore, read_chunks

log = get_logger("contentsvc.projectors.materializer")

MAX_NORMALIZER_ATTEMPTS = 5  # part 1: the manifest's retry.max_attempts, capped at 5
DEFERRED_BATCH = 20  # deferred Receipts retried per step; the journal's batches go between

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


@dataclass(frozen=True)
class Pin:
    """Receipt processing waiting for a normalizer plugin: the plan and registration it started
    under (decisions-part2: pinned work keeps them through retries and restarts) and the attempts
    spent, by kind."""

    plan_id: str
    registration_id: str
    attempts: int = 0  # every attempt that did not answer
    budget_spent: int = 0  # attempts answered with a retryable error or timed out (the manifest's budget)


class Deferred(Exception):
    """The normalizer cannot answer now: the Receipt waits and is tried again."""

    def __init__(self, pin: Pin, cause: str) -> None:
        super().__init__(cause)
        self.pin = pin
        self.cause = cause


def _invocation_diagnostic(code: str, message: str, provider: Provider, invocation_id: str) -> dict[str, Any]:
    return {"code": code, "message": message, "retryable": False, "plugin": provider.plugin_id,
            "contribution": "normalizer", "invocation_id": invocation_id}


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


class MaterializerProjector(TableFold):
    name = "materializer"

    def __init__(self, blob_root: Path, settings: Settings | None = None) -> None:
        self.blob_root = blob_root
        self.settings = settings or Settings(home=blob_root.parent)
        self._blob_store: BlobStore | None = None
        self.plan = ActivePlan(self.settings)
        self._clients: dict[str, PluginClient] = {}  # registration_id -> its client (discovery state shared)
        self._pinned: dict[str, Provider] = {}  # registration_id -> how to call it, for deferred work

    @classmethod
    def from_settings(cls, settings: Settings) -> "MaterializerProjector":
        return cls(settings.blob_root, settings)  # CONTENTSVC_HOME/blobs, as the API writes them

    @property
    def blob_store(self) -> BlobStore:
        if self._blob_store is None:  # opened on the first Blob to read
            self._blob_store = FilesystemBlobStore(self.blob_root)
        return self._blob_store

    async def step(self, conn: AsyncConnection) -> bool:
        more = await super().step(conn)
        return await self._retry_deferred(conn) or more

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        commands = [e for e in events if e.kind in (ev.INGEST_ACCEPTED, ev.WITHDRAWAL_ACCEPTED)]
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
                touched.add(key)
            if e.kind == ev.INGEST_ACCEPTED:
                try:
                    out.extend(await self._ingest(e, identities, key, e.position in superseded))
                except Deferred as wait:
                    await self._defer(conn, e, key, wait)
            else:
                out.extend(self._withdraw(e, identities, key))
            touched.add(key)
        # A deferred revision of a new identity leaves no identity behind yet.
        await self._save(conn, {k: identities[k] for k in touched if k in identities})
        await append(conn, out)

    # ------------------------------------------------------------ deferred Receipts

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

    async def _accepted_at(self, conn: AsyncConnection, position: int) -> JournalEvent:
        [event] = await read_after(conn, position - 1, 1)
        return event

    async def _settle_overtaken(self, conn: AsyncConnection, earlier: tuple[str, int], newer: JournalEvent,
                                identities: dict, key: tuple) -> list[NewEvent]:
        receipt_id, position = earlier
        await conn.execute("DELETE FROM materializer_deferred WHERE receipt_id = %s", (receipt_id,))
        e = await self._accepted_at(conn, position)
        if newer.kind == ev.INGEST_ACCEPTED:  # a newer revision before this one was normalized
            return await self._ingest(e, identities, key, True)
        state = identities.get(key)
        record_id = state.record_id if state else new_id("rec")
        identities.setdefault(key, Identity(record_id, None, None, False))
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=receipt_id)
        return [self._resolved(common, "conflict", record_id, None, [RECORD_WITHDRAWN_DIAGNOSTIC])]

    async def _defer(self, conn: AsyncConnection, e: JournalEvent, key: tuple, wait: Deferred) -> None:
        pin = wait.pin
        delay = random_backoff_delay(pin.attempts)
        log.warning("normalization_deferred", receipt_id=e.payload.receipt_id, plan_id=pin.plan_id,
                    registration_id=pin.registration_id, attempts=pin.attempts, retry_in_s=round(delay, 1),
                    cause=wait.cause)
        await conn.execute(
            "INSERT INTO materializer_deferred (receipt_id, org_id, corpus_id, namespace, record_key, position,"
            " plan_id, registration_id, attempts, budget_spent, next_attempt_at, last_error)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (receipt_id) DO UPDATE SET attempts = EXCLUDED.attempts,"
            " budget_spent = EXCLUDED.budget_spent, next_attempt_at = EXCLUDED.next_attempt_at,"
            " last_error = EXCLUDED.last_error",
            (e.payload.receipt_id, *key, e.position, pin.plan_id, pin.registration_id, pin.attempts,
             pin.budget_spent, datetime.now(timezone.utc) + timedelta(seconds=delay), wait.cause[:1024]))

    async def _retry_deferred(self, conn: AsyncConnection) -> bool:
        """Try the deferred Receipts that are due, in journal order, under the checkpoint's lock
        (a replay does not interleave). True when more are due."""
        async with journal_transaction(conn):
            # Due, or stopped by a rollback (part 2: `pinned_work` "stop" quarantines a Version
            # waiting for text from the registration the rollback left): the latter at once.
            cur = await conn.execute(
                "SELECT d.receipt_id, d.position, d.plan_id, d.registration_id, d.attempts, d.budget_spent,"
                "       stop.plan_id"
                " FROM materializer_deferred d"
                " JOIN plugin_plans started ON started.plan_id = d.plan_id"
                " LEFT JOIN LATERAL (SELECT q.plan_id FROM plugin_plans q WHERE q.pinned_work = 'stop'"
                "   AND q.created_at > started.created_at"
                "   AND NOT q.roles @> jsonb_build_array(jsonb_build_object('registration_id', d.registration_id))"
                "   ORDER BY q.created_at LIMIT 1) stop ON true"
                " WHERE d.next_attempt_at <= now() OR stop.plan_id IS NOT NULL"
                " ORDER BY d.position LIMIT %s",
                (DEFERRED_BATCH + 1,))
            due = await cur.fetchall()
            if not due:
                return False
            await checkpoints.position(conn, self.name, for_update=True)
            await self.plan.refresh_if_due(conn)
            out: list[NewEvent] = []
            for receipt_id, position, plan_id, registration_id, attempts, budget_spent, stop in due[:DEFERRED_BATCH]:
                e = await self._accepted_at(conn, position)
                key = _key(e)
                identities = await self._load(conn, {key})
                if stop is not None:
                    out.extend(await self._ingest(e, identities, key, False, stopped={
                        "code": "pinned_plan_stopped", "retryable": False, "contribution": "normalizer",
                        "message": f"Rollback plan {stop} stopped the work pinned to plan {plan_id} "
                                   f"(registration {registration_id}) before the normalizer answered."}))
                    await conn.execute("DELETE FROM materializer_deferred WHERE receipt_id = %s", (receipt_id,))
                    if key in identities:
                        await self._save(conn, {key: identities[key]})
                    continue
                if registration_id not in self._pinned:
                    found = await load_provider(conn, self.settings, registration_id)
                    if found is not None:
                        self._pinned[registration_id] = found
                try:
                    out.extend(await self._ingest(e, identities, key, False,
                                                  Pin(plan_id, registration_id, attempts, budget_spent)))
                except Deferred as wait:
                    await self._defer(conn, e, key, wait)
                    continue
                await conn.execute("DELETE FROM materializer_deferred WHERE receipt_id = %s", (receipt_id,))
                if key in identities:
                    await self._save(conn, {key: identities[key]})
            await append(conn, out)
        return len(due) > DEFERRED_BATCH

    # ------------------------------------------------------------ ingest

    async def _ingest(self, e: JournalEvent, identities: dict, key: tuple, superseded: bool,
                      pin: Pin | None = None, stopped: dict[str, Any] | None = None) -> list[NewEvent]:
        p = e.payload
        state = identities.get(key)
        receipt_id = p.receipt_id
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=receipt_id)
        if state is not None and state.withdrawn:
            return [self._resolved(common, "conflict", state.record_id, None, [RECORD_WITHDRAWN_DIAGNOSTIC])]
        record_id = state.record_id if state else new_id("rec")
        version_id = new_id("ver")
        if superseded or stopped:  # the normalizer is not invoked: the manifest stays as accepted
            manifest = build_manifest(p.content, p.title)
            diagnostics = [stopped or NORMALIZATION_SUPERSEDED_DIAGNOSTIC]
        else:
            manifest, diagnostics = await self._normalize(e, record_id, version_id, pin)
        digest = manifest_digest(manifest)
        # Text equal to the serving Version's is a duplicate, superseded or not (decided without a normalizer).
        if state is not None and state.current_digest == digest:
            return [self._resolved(common, "duplicate", state.record_id, state.current_version_id, [])]
        previous = state.current_version_id if state else None
        if diagnostics:  # quarantined: never current, so the identity's serving Version stays
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
                    extensions=p.extensions,
                    relations=p.relations,
                    accepted_at=p.accepted_at,
                    created_at=_now(),
                    previous_version_id=previous,
                    diagnostics=diagnostics,
                    quarantined=bool(diagnostics),
                ),
                **common,
            ),
            self._resolved(common, "created", record_id, version_id, diagnostics),
        ]
        # Not current yet: the lexical projector moves currentness once the Version can serve.
        out.insert(1, currentness.availability_event(out[0], "quarantined" if diagnostics else "materialized"))
        return out

    async def _normalize(self, e: JournalEvent, record_id: str, version_id: str, pin: Pin | None
                         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The Version's manifest and diagnostics: Blob Parts become text Parts (by the plugin the
        plan routes their media type to, else the built-in text path), or the Version is quarantined
        (manifest as accepted, one diagnostic). Raises Deferred when a plugin cannot answer now."""
        p = e.payload
        manifest = build_manifest(p.content, p.title)
        if not any(part["content"]["kind"] == "blob" for part in manifest["parts"]):
            return manifest, []
        parts = []
        for part in manifest["parts"]:
            content = part["content"]
            if content["kind"] != "blob":
                parts.append(part)
                continue
            verified = (p.blobs or {}).get(content["blob_id"])
            try:
                provider, pin = await self._normalizer(content["media_type"], pin)
                if provider is not None:
                    self._verified_bytes(verified, content, keep=False)
                    produced, diagnostic = await self._plugin_parts(e, record_id, version_id, content, verified,
                                                                    provider, pin)
                    if diagnostic is not None:
                        return manifest, [diagnostic]
                    parts.extend(produced)
                    continue
                text = self._blob_text(verified, content)
            except TextPathError as exc:
                return manifest, [exc.diagnostic()]
            parts.append({**part, "content": {"kind": "text", "text": text}})
        keys = [part["key"] for part in parts]
        if len(set(keys)) != len(keys):
            return manifest, [{"code": "normalizer_invalid_output", "retryable": False,
                               "message": "The normalizer's Parts reuse a key of another Part of the Version."}]
        return {"parts": parts}, []

    async def _normalizer(self, media_type: str, pin: Pin | None) -> tuple[Provider | None, Pin | None]:
        """The plugin to call for media_type: the pinned registration when the work already started
        under a plan, else the active plan's route (None: the built-in text path)."""
        if pin is not None:
            provider = self._pinned.get(pin.registration_id)
            if provider is None:
                raise TextPathError("pinned_plugin_unavailable", f"Plan {pin.plan_id} pins registration "
                                    f"{pin.registration_id}, which the registry does not hold.")
            return provider, pin
        provider = self.plan.normalizer_for(media_type.split(";")[0].strip().lower())
        if provider is None:
            return None, None
        return provider, Pin(self.plan.plan_id, provider.registration_id)

    def _client(self, provider: Provider) -> PluginClient:
        client = self._clients.get(provider.registration_id)
        if client is None:
            client = self._clients[provider.registration_id] = PluginClient(provider.target)
        return client

    async def _plugin_parts(self, e: JournalEvent, record_id: str, version_id: str, content: dict[str, Any],
                            verified: ev.VerifiedBlob, provider: Provider, pin: Pin
                            ) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        """One normalizer invocation (part 2, normalizer request); its Parts, or a quarantining diagnostic."""
        p = e.payload
        invocation_id = new_id("inv")
        request: dict[str, Any] = {
            "invocation_id": invocation_id,
            "idempotency_key": f"{p.receipt_id}:{content['blob_id']}",  # stable across retries and restarts
            "contribution": "normalizer",
            "organization_id": e.org_id,
            "corpus_id": p.source.corpus_id,
            "record_id": record_id,
            "record_version_id": version_id,
            "source": {"corpus_id": p.source.corpus_id, "namespace": p.source.namespace,
                       "record_key": p.source.record_key},
            "input": {"blob_id": content["blob_id"], "media_type": content["media_type"],
                      "size_bytes": verified.size_bytes, "sha256": verified.sha256,
                      "reference": {"url": self.blob_store.path_for(verified.storage_key).resolve().as_uri()}},
            "configuration": provider.settings.configuration,
        }
        if p.extensions:
            request["extensions"] = p.extensions
        retry = provider.manifest.retry
        budget = min(retry.max_attempts, MAX_NORMALIZER_ATTEMPTS)
        try:
            answer = await self._client(provider).invoke("normalizer", request, float(retry.timeout_seconds),
                                                         invocation_id)
        except PluginFailed as exc:
            said = f"{provider.plugin_id} {provider.version} answered {exc.code}: {exc.message}"
            if not exc.retryable:
                return [], _invocation_diagnostic("normalizer_failed", said, provider, invocation_id)
            spent = Pin(pin.plan_id, pin.registration_id, pin.attempts + 1, pin.budget_spent + 1)
            if spent.budget_spent >= budget:
                return [], _invocation_diagnostic("normalizer_retries_exhausted", f"{said} ({spent.budget_spent} "
                                                  "attempts, the manifest's retry budget)", provider, invocation_id)
            raise Deferred(spent, said) from None
        except PluginUnreachable as exc:
            timed_out = exc.cause == "timeout"
            spent = Pin(pin.plan_id, pin.registration_id, pin.attempts + 1, pin.budget_spent + int(timed_out))
            if timed_out and spent.budget_spent >= budget:
                return [], _invocation_diagnostic("normalizer_timeout", f"{exc.message} ({spent.budget_spent} "
                                                  "attempts, the manifest's retry budget)", provider, invocation_id)
            if pin.plan_id != self.plan.plan_id and spent.attempts >= self.settings.pinned_plugin_attempts:
                return [], _invocation_diagnostic(
                    "pinned_plugin_unavailable", f"Plan {pin.plan_id} pins {provider.plugin_id} "
                    f"{provider.version}, which stayed unreachable for {spent.attempts} attempts: {exc.message}",
                    provider, invocation_id)
            raise Deferred(spent, f"{exc.cause}: {exc.message}") from None
        problem = _answer_problem(answer, provider)
        if problem is not None:
            return [], _invocation_diagnostic("normalizer_invalid_output", f"{provider.plugin_id} "
                                              f"{provider.version}: {problem}", provider, invocation_id)
        return [_text_part(part) for part in answer["manifest"]["parts"]], None

    def _verified_bytes(self, verified: ev.VerifiedBlob | None, content: dict[str, Any], keep: bool) -> bytes:
        """The Blob's bytes (kept only when `keep`), checked against what was verified at acceptance."""
        blob_id = content["blob_id"]
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
        return blob_text(self._verified_bytes(verified, content, keep=True), media_type)

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


def _answer_problem(answer: dict[str, Any], provider: Provider) -> str | None:
    """Why a normalizer answer breaks part 2's response or part 1's Part rules (None: it keeps them).
    Only text Parts are published: a Blob Part would need a second normalization."""
    import jsonschema

    normalizer = provider.manifest.contributions.normalizer
    max_parts = normalizer.max_parts if normalizer is not None else 256
    namespaces = [x.namespace for x in normalizer.extensions] if normalizer is not None else []
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(normalizer_response_schema(max_parts, namespaces)).iter_errors(answer))
    if error is not None:
        where = "/" + "/".join(str(step) for step in error.absolute_path)
        return f"the answer breaks the normalizer response at {where}: {error.message[:200]}"
    keys: set[str] = set()
    for part in answer["manifest"]["parts"]:
        if part["content"]["kind"] != "text":
            return f"Part {part['key']!r} is not text"
        if part["key"] in keys:
            return f"Part key {part['key']!r} appears twice"
        if part.get("parent_key") is not None and part["parent_key"] not in keys:
            return f"Part {part['key']!r} names a parent_key that is not an earlier Part"
        keys.add(part["key"])
    return None


def _text_part(part: dict[str, Any]) -> dict[str, Any]:
    out = {"key": part["key"], "role": part["role"], "content": {"kind": "text", "text": nfc(part["content"]["text"])}}
    if part.get("parent_key") is not None:
        out["parent_key"] = part["parent_key"]
    if part.get("extensions"):
        out["extensions"] = part["extensions"]
    return out
