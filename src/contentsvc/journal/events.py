"""The event catalogue: every kind the journal holds, and which are public.

Public kinds are the change feed's ChangeEvents (decisions.md, Change feed);
the others are internal facts that projectors fold (the accepted command
with its input, for instance). docs/architecture.md lists each kind's payload.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from contentsvc.domain.ids import new_id

# Commands accepted (internal: they carry the client's input).
INGEST_ACCEPTED = "ingest.accepted"
WITHDRAWAL_ACCEPTED = "withdrawal.accepted"

# Search enrichment (internal: the change feed shows availability moves only).
RECORD_ENRICHED = "record.enriched"

# Uploads (internal: an upload belongs to no Corpus, so no change feed shows it).
UPLOAD_CREATED = "upload.created"
UPLOAD_RECEIVED = "upload.received"
UPLOAD_VERIFIED = "upload.verified"
UPLOAD_FAILED = "upload.failed"

# Public facts (the change feed's kinds for part 1).
CORPUS_CREATED = "corpus.created"
CORPUS_RETRIEVAL_CHANGED = "corpus.retrieval_changed"
RECORD_ACCEPTED = "record.accepted"
RECORD_AVAILABILITY_CHANGED = "record.availability_changed"
RECORD_WITHDRAWN = "record.withdrawn"
RECEIPT_RESOLVED = "receipt.resolved"
OPERATION_CHANGED = "operation.changed"

PUBLIC_KINDS = frozenset(
    {
        CORPUS_CREATED,
        CORPUS_RETRIEVAL_CHANGED,
        RECORD_ACCEPTED,
        RECORD_AVAILABILITY_CHANGED,
        RECORD_WITHDRAWN,
        RECEIPT_RESOLVED,
        OPERATION_CHANGED,
    }
)


class NewEvent(msgspec.Struct, kw_only=True):
    """An event about to be appended; the journal gives it a position."""

    kind: str
    org_id: str
    subject_type: str
    subject_id: str
    payload: dict[str, Any]
    corpus_id: str | None = None
    version_id: str | None = None
    receipt_id: str | None = None
    event_id: str = msgspec.field(default_factory=lambda: new_id("evt"))

    @property
    def public(self) -> bool:
        return self.kind in PUBLIC_KINDS


class JournalEvent(msgspec.Struct, kw_only=True):
    """An event as committed."""

    position: int
    event_id: str
    kind: str
    public: bool
    org_id: str
    corpus_id: str | None
    subject_type: str
    subject_id: str
    version_id: str | None
    receipt_id: str | None
    payload: dict[str, Any]
    committed_at: datetime
