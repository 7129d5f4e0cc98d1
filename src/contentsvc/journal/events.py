"""The event catalogue: every kind the journal holds, its payload, and which are public.

Each kind is one payload Struct tagged with the kind, so an event's kind is
its payload's type and the two cannot disagree. Public kinds are the change
feed's ChangeEvents (decisions.md, Change feed); the others are internal
facts that projectors fold (the accepted command with its input, for
instance). docs/architecture.md lists the catalogue; a test holds it to
these Structs.

Member names are the journal's JSON keys: renaming one breaks the decoding
of every journal written before. A member a reader may find absent in older
events has a default; a member that is absent rather than null when it does
not apply is `UNSET` (never encoded). Timestamps stay the RFC 3339 strings
the contract writes (domain/clock), so a payload's JSON is what it was.
Nested client data (a manifest, provenance, extensions, relations, a
retrieval configuration) stays the client's JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType

from contentsvc.connectors.events import (
    ConnectorChanged,
    ConnectorCreated,
    ConnectorPushReceived,
    ConnectorPushRefused,
    ConnectorRunChanged,
)
from contentsvc.ids import new_id
from contentsvc.monitoring.delivery_events import DeliveryChanged
from contentsvc.monitoring.match_events import MatchCreated, MatchWithdrawn
from contentsvc.monitoring.events import (
    SavedQueryCommitted,
    SavedQueryDeleted,
    SavedQueryRenamed,
    SavedQueryUpdated,
    SubscriptionCommitted,
    SubscriptionDeleted,
    SubscriptionRenamed,
    SubscriptionUpdated,
)
from contentsvc.plugins.events import (
    PluginChecked,
    PluginPlanCommitted,
    PluginRegistered,
    PluginStateChanged,
)

Timestamp = str  # RFC 3339, UTC, as the contract writes it
JsonObject = dict[str, Any]  # a client's JSON object, kept as given


class EventPayload(msgspec.Struct, kw_only=True, tag_field="kind"):
    """Base of every payload; a subclass names its kind with `tag=`."""

    public: ClassVar[bool] = False


def kind_of(payload: EventPayload) -> str:
    return type(payload).__struct_config__.tag


# ----------------------------------------------------------------- nested shapes


class Source(msgspec.Struct, kw_only=True):
    """A Record's source identity."""

    corpus_id: str
    namespace: str
    record_key: str


class VerifiedBlob(msgspec.Struct, kw_only=True):
    """A Blob as verified when a command referencing it was accepted."""

    sha256: str
    size_bytes: int
    storage_key: str


class OperationMoves(msgspec.Struct, kw_only=True):
    """The members of a public Operation document that an event moves."""

    operation_id: str
    kind: str | UnsetType = UNSET
    state: str | UnsetType = UNSET
    corpus_id: str | UnsetType = UNSET
    counters: dict[str, int] | UnsetType = UNSET
    progress: float | UnsetType = UNSET
    errors: list[JsonObject] | UnsetType = UNSET
    result: JsonObject | UnsetType = UNSET
    previous_operation_id: str | UnsetType = UNSET


class OperationRequest(msgspec.Struct, kw_only=True):
    """What an accepted Operation asks the lexical projector to build."""

    kind: str
    retrieval: JsonObject | UnsetType = UNSET  # the resolved configuration, for a configuration change


# ----------------------------------------- commands accepted (internal: they carry the client's input)

INGEST_ACCEPTED = "ingest.accepted"
WITHDRAWAL_ACCEPTED = "withdrawal.accepted"


class IngestAccepted(EventPayload, kw_only=True, tag=INGEST_ACCEPTED):
    receipt_id: str
    source: Source
    content: JsonObject
    title: str | None = None
    provenance: JsonObject
    extensions: JsonObject | None = None
    relations: list[JsonObject] = []
    accepted_at: Timestamp
    blobs: dict[str, VerifiedBlob] | UnsetType = UNSET  # by blob_id, when the content references Blobs


class WithdrawalAccepted(EventPayload, kw_only=True, tag=WITHDRAWAL_ACCEPTED):
    receipt_id: str
    source: Source
    reason: str | None = None
    accepted_at: Timestamp


# ------------------------------------------------------------------------ Corpora (public)

CORPUS_CREATED = "corpus.created"
CORPUS_RETRIEVAL_CHANGED = "corpus.retrieval_changed"


class CorpusCreated(EventPayload, kw_only=True, tag=CORPUS_CREATED):
    public = True
    corpus_id: str
    name: str
    retrieval: JsonObject  # effective
    projection_generation_id: str
    vector_spaces: list[str]
    created_at: Timestamp


class CorpusRetrievalChanged(EventPayload, kw_only=True, tag=CORPUS_RETRIEVAL_CHANGED):
    """A cutover: the configuration now effective and the generation now routed."""

    public = True
    corpus_id: str
    retrieval: JsonObject
    projection_generation_id: str
    vector_spaces: list[str]


# ------------------------------------------------------------------------ Records and Receipts

RECORD_ACCEPTED = "record.accepted"
RECORD_AVAILABILITY_CHANGED = "record.availability_changed"
RECORD_ENRICHED = "record.enriched"  # internal: the change feed shows availability moves only
RECORD_ENRICHMENT_BLOCKED = "record.enrichment_blocked"  # internal, as record.enriched
RECORD_WITHDRAWN = "record.withdrawn"
RECEIPT_RESOLVED = "receipt.resolved"

AvailabilityState = Literal["materialized", "building_baseline", "retrieval_ready", "quarantined"]


class RecordAccepted(EventPayload, kw_only=True, tag=RECORD_ACCEPTED):
    """A new Version; its normalized manifest is the canonical text every index is built from."""

    public = True
    record_id: str
    version_id: str
    receipt_id: str
    source: Source
    manifest: JsonObject
    provenance: JsonObject
    extensions: JsonObject | None = None
    relations: list[JsonObject] = []
    accepted_at: Timestamp
    created_at: Timestamp
    previous_version_id: str | None = None
    diagnostics: list[JsonObject] = []
    quarantined: bool = False
    language: str | None = None  # BCP 47, as the normalizer plugin said


class RecordAvailabilityChanged(EventPayload, kw_only=True, tag=RECORD_AVAILABILITY_CHANGED):
    """state and searchable are absent when only currentness moved."""

    public = True
    record_id: str
    version_id: str
    is_current: bool
    state: AvailabilityState | UnsetType = UNSET
    searchable: bool | UnsetType = UNSET


class RecordEnriched(EventPayload, kw_only=True, tag=RECORD_ENRICHED):
    """The Version's vectors of a space exist."""

    record_id: str
    version_id: str
    space: str


class RecordEnrichmentBlocked(EventPayload, kw_only=True, tag=RECORD_ENRICHMENT_BLOCKED):
    """The Version's vectors of a space cannot be made until an operator intervenes (the
    diagnostic, a part 1 Diagnostic, says why); record.enriched ends it."""

    record_id: str
    version_id: str
    space: str
    diagnostic: JsonObject


class RecordWithdrawn(EventPayload, kw_only=True, tag=RECORD_WITHDRAWN):
    public = True
    record_id: str
    source: Source
    current_version_id: str | None = None
    withdrawn_at: Timestamp


class ReceiptResolved(EventPayload, kw_only=True, tag=RECEIPT_RESOLVED):
    public = True
    receipt_id: str
    outcome: Literal["created", "duplicate", "withdrawal_applied", "conflict"]
    record_id: str | None = None
    version_id: str | None = None
    diagnostics: list[JsonObject] = []
    resolved_at: Timestamp


# ------------------------------------------- Uploads (internal: an upload belongs to no Corpus)

UPLOAD_CREATED = "upload.created"
UPLOAD_RECEIVED = "upload.received"
UPLOAD_VERIFIED = "upload.verified"
UPLOAD_FAILED = "upload.failed"
BLOB_COLLECTED = "blob.collected"


class UploadCreated(EventPayload, kw_only=True, tag=UPLOAD_CREATED):
    upload_id: str
    blob_id: str
    media_type: str
    size_bytes: int
    sha256: str
    filename: str | None = None
    expires_at: Timestamp
    created_at: Timestamp


class UploadReceived(EventPayload, kw_only=True, tag=UPLOAD_RECEIVED):
    """size_bytes and sha256 as computed while streaming."""

    upload_id: str
    size_bytes: int
    sha256: str
    storage_key: str | None = None  # None when the bytes were not the declared ones (dropped)
    received_at: Timestamp


class UploadVerified(EventPayload, kw_only=True, tag=UPLOAD_VERIFIED):
    upload_id: str
    blob_id: str
    media_type: str
    size_bytes: int
    sha256: str
    storage_key: str
    verified_at: Timestamp


class UploadFailed(EventPayload, kw_only=True, tag=UPLOAD_FAILED):
    upload_id: str
    error: JsonObject  # an Error: size_mismatch, checksum_mismatch or upload_expired
    failed_at: Timestamp


class BlobCollected(EventPayload, kw_only=True, tag=BLOB_COLLECTED):
    """A verified Blob that no ingest referenced, past its upload's expiry: it may no longer be
    referenced, and its bytes are deleted once no other Blob or upload holds the same content."""

    blob_id: str
    storage_key: str
    collected_at: Timestamp


# ------------------------------------------------------------------------ Operations (public)

OPERATION_CHANGED = "operation.changed"


class OperationChanged(EventPayload, kw_only=True, tag=OPERATION_CHANGED):
    """An acceptance also carries the request, which the read model keeps out of the public Operation."""

    public = True
    operation: OperationMoves
    request: OperationRequest | UnsetType = UNSET


# ------------------------------------------------------------------------ the catalogue

Payload = Union[
    IngestAccepted, WithdrawalAccepted,
    CorpusCreated, CorpusRetrievalChanged,
    RecordAccepted, RecordAvailabilityChanged, RecordEnriched, RecordEnrichmentBlocked, RecordWithdrawn,
    ReceiptResolved,
    UploadCreated, UploadReceived, UploadVerified, UploadFailed, BlobCollected,
    OperationChanged,
    # the plugin registry (plugins/events.py)
    PluginRegistered, PluginChecked, PluginStateChanged, PluginPlanCommitted,
    # monitoring (monitoring/match_events.py, monitoring/delivery_events.py)
    MatchCreated, MatchWithdrawn, DeliveryChanged,
    # saved queries and subscriptions (monitoring/events.py)
    SavedQueryCommitted, SavedQueryUpdated, SavedQueryDeleted, SavedQueryRenamed,
    SubscriptionCommitted, SubscriptionUpdated, SubscriptionDeleted, SubscriptionRenamed,
    # connectors (connectors/events.py)
    ConnectorCreated, ConnectorChanged, ConnectorRunChanged, ConnectorPushReceived, ConnectorPushRefused,
]
PAYLOAD_TYPES: dict[str, type[EventPayload]] = {t.__struct_config__.tag: t for t in Payload.__args__}
PUBLIC_KINDS = frozenset(kind for kind, t in PAYLOAD_TYPES.items() if t.public)


class NewEvent(msgspec.Struct, kw_only=True):
    """An event about to be appended; the journal gives it a position."""

    org_id: str
    subject_type: str
    subject_id: str
    payload: EventPayload
    corpus_id: str | None = None
    version_id: str | None = None
    receipt_id: str | None = None
    event_id: str = msgspec.field(default_factory=lambda: new_id("evt"))

    @property
    def kind(self) -> str:
        return kind_of(self.payload)

    @property
    def public(self) -> bool:
        return type(self.payload).public


class JournalEvent(msgspec.Struct, kw_only=True):
    """An event as committed.

    The payload of a kind outside this catalogue (one a later version or a
    tool appended) is left undecoded, as msgspec.Raw: folds skip kinds they
    do not know.
    """

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
    payload: Payload | msgspec.Raw
    committed_at: datetime
