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
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from contentsvc.projectors import currentness
from contentsvc.projectors.base import TableFold
from psycopg import AsyncConnection

from contentsvc.config import MAX_TEXT_BLOB_BYTES, Settings
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

    def __init__(self, blob_root: Path) -> None:
        self.blob_root = blob_root
        self._blob_store: BlobStore | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> "MaterializerProjector":
        return cls(settings.blob_root)  # CONTENTSVC_HOME/blobs, as the API writes them

    @property
    def blob_store(self) -> BlobStore:
        if self._blob_store is None:  # opened on the first Blob to read
            self._blob_store = FilesystemBlobStore(self.blob_root)
        return self._blob_store

    async def apply(self, conn: AsyncConnection, events: list[JournalEvent]) -> None:
        commands = [e for e in events if e.kind in (ev.INGEST_ACCEPTED, ev.WITHDRAWAL_ACCEPTED)]
        if not commands:
            return
        identities = await self._load(conn, {_key(e) for e in commands})
        superseded = _superseded(commands)
        touched: set[tuple] = set()
        out: list[NewEvent] = []
        for e in commands:
            key = _key(e)
            if e.kind == ev.INGEST_ACCEPTED:
                out.extend(self._ingest(e, identities, key, e.position in superseded))
            else:
                out.extend(self._withdraw(e, identities, key))
            touched.add(key)
        await self._save(conn, {k: identities[k] for k in touched})
        await append(conn, out)

    def _ingest(self, e: JournalEvent, identities: dict, key: tuple, superseded: bool) -> list[NewEvent]:
        p = e.payload
        state = identities.get(key)
        receipt_id = p.receipt_id
        common = dict(org_id=e.org_id, corpus_id=key[1], receipt_id=receipt_id)
        if state is not None and state.withdrawn:
            return [self._resolved(common, "conflict", state.record_id, None, [RECORD_WITHDRAWN_DIAGNOSTIC])]
        if superseded:  # the normalizer is not invoked: the manifest stays as accepted
            manifest, diagnostics = build_manifest(p.content, p.title), [NORMALIZATION_SUPERSEDED_DIAGNOSTIC]
        else:
            manifest, diagnostics = self._normalize(p)
        digest = manifest_digest(manifest)
        # Text equal to the serving Version's is a duplicate, superseded or not (decided without a normalizer).
        if state is not None and state.current_digest == digest:
            return [self._resolved(common, "duplicate", state.record_id, state.current_version_id, [])]
        record_id = state.record_id if state else new_id("rec")
        version_id = new_id("ver")
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

    def _normalize(self, p: ev.IngestAccepted) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The Version's manifest and diagnostics: Blob Parts become text Parts, or the
        Version is quarantined (manifest as accepted, one diagnostic)."""
        manifest = build_manifest(p.content, p.title)
        if not any(part["content"]["kind"] == "blob" for part in manifest["parts"]):
            return manifest, []
        parts = []
        for part in manifest["parts"]:
            content = part["content"]
            if content["kind"] != "blob":
                parts.append(part)
                continue
            try:
                text = self._blob_text((p.blobs or {}).get(content["blob_id"]), content)
            except TextPathError as exc:
                return manifest, [exc.diagnostic()]
            parts.append({**part, "content": {"kind": "text", "text": text}})
        return {"parts": parts}, []

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
        h, chunks, size = hashlib.sha256(), [], 0
        try:
            with self.blob_store.open_read(verified.storage_key) as reader:
                for chunk in read_chunks(reader):
                    size += len(chunk)
                    if size > verified.size_bytes:
                        break
                    h.update(chunk)
                    chunks.append(chunk)
        except (OSError, ValueError) as exc:
            raise TextPathError("input_unverified", f"Blob {blob_id} cannot be read from the blob store "
                                f"({type(exc).__name__}).") from None
        if size != verified.size_bytes or h.hexdigest() != verified.sha256:
            raise TextPathError("input_unverified", f"Blob {blob_id} in the blob store is no longer the verified "
                                "input (its size or SHA-256 changed).")
        return blob_text(b"".join(chunks), media_type)

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
