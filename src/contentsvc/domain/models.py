"""Every request, response and view of the HTTP contract as msgspec Structs.

These Structs are the single definition: the API decodes into them, encodes
from them, and the OpenAPI document is generated from them. Field names and
shapes follow part 1 of the contract and decisions.md exactly.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

NonEmpty = Annotated[str, Meta(min_length=1)]
LogicalName = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
CORPUS_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
CorpusIdPattern = Annotated[str, Meta(pattern=CORPUS_ID_PATTERN)]


class Input(Struct, forbid_unknown_fields=True, kw_only=True):
    """A request body: unknown members are refused (422 invalid_schema)."""


class Output(Struct, omit_defaults=True, kw_only=True):
    """A response body: optional members are omitted when absent."""


# ---------------------------------------------------------------- shared


class Error(Output, kw_only=True):
    code: NonEmpty
    message: NonEmpty
    retryable: bool
    field: str | None = None
    resync_url: str | None = None


class SourceIdentity(Input, kw_only=True):
    corpus_id: NonEmpty
    namespace: NonEmpty
    record_key: NonEmpty


class SourceIdentityView(Output, kw_only=True):
    corpus_id: str
    namespace: str
    record_key: str


# ---------------------------------------------------------------- content


class TextContent(Input, kw_only=True, tag_field="kind", tag="text"):
    text: NonEmpty


class BlobContent(Input, kw_only=True, tag_field="kind", tag="blob"):
    blob_id: NonEmpty
    media_type: NonEmpty


class Extension(Input, kw_only=True):
    schema_version: str
    data: dict


class Part(Input, kw_only=True):
    key: NonEmpty
    role: NonEmpty
    content: Union[TextContent, BlobContent]
    parent_key: NonEmpty | None = None
    extensions: dict[str, Extension] | None = None


class ManifestContent(Input, kw_only=True, tag_field="kind", tag="manifest"):
    parts: Annotated[list[Part], Meta(min_length=1, max_length=256)]


Content = Union[TextContent, BlobContent, ManifestContent]


class Provenance(Input, kw_only=True):
    origin: Literal["client", "connector"] = "client"
    producer: NonEmpty | None = None
    producer_version: NonEmpty | None = None
    connector: NonEmpty | None = None


class RelationInput(Input, kw_only=True):
    relation: LogicalName
    target: SourceIdentity


class IngestCommand(Input, kw_only=True):
    idempotency_key: NonEmpty
    source: SourceIdentity
    content: Content
    title: NonEmpty | None = None
    provenance: Provenance | None = None
    extensions: dict[str, Extension] | None = None
    relations: Annotated[list[RelationInput], Meta(max_length=64)] | None = None


class BatchRequest(Input, kw_only=True):
    # Entries stay raw here: each one is validated on its own (rule 2).
    entries: list[msgspec.Raw]


class WithdrawalCommand(Input, kw_only=True):
    idempotency_key: NonEmpty
    source: SourceIdentity
    reason: NonEmpty | None = None


# ---------------------------------------------------------------- receipts


class Availability(Output, kw_only=True):
    state: Literal["materialized", "building_baseline", "retrieval_ready", "quarantined"]
    is_current: bool
    searchable: bool


class ProcessingSummary(Output, kw_only=True):
    state: Literal["queued", "running", "retrying", "blocked", "idle"]
    phase: Literal["materialization", "baseline", "enrichment"] | None = None
    message: str | None = None


class Diagnostic(Output, kw_only=True):
    code: str
    message: str
    retryable: bool
    plugin: str | None = None
    contribution: str | None = None
    invocation_id: str | None = None


class Receipt(Output, kw_only=True):
    receipt_id: str
    state: Literal["pending", "resolved"]
    outcome: Literal["created", "duplicate", "withdrawal_applied", "conflict"] | None = None
    record_id: str | None = None
    version_id: str | None = None
    availability: Availability | None = None
    diagnostics: list[Diagnostic]
    source: SourceIdentityView
    processing: ProcessingSummary


class BatchItem(Output, kw_only=True):
    index: int
    status: int
    receipt: Receipt | None = None
    error: Error | None = None


class BatchResult(Output, kw_only=True):
    items: list[BatchItem]


# ---------------------------------------------------------------- records


class Record(Output, kw_only=True):
    record_id: str
    source: SourceIdentityView
    current_version_id: str | None = None
    withdrawn: bool


class RecordPage(Output, kw_only=True):
    items: list[Record]
    next_page_cursor: str | None = None


class RelationView(Output, kw_only=True):
    relation: str
    target_source: SourceIdentityView
    available: bool
    target_record_id: str | None = None
    target_version_id: str | None = None


class Version(Output, kw_only=True):
    version_id: str
    record_id: str
    source: SourceIdentityView
    availability: Availability
    manifest: dict
    processing: ProcessingSummary
    relations: list[RelationView]
    provenance: dict
    extensions: dict | None = None
    language: str | None = None
    diagnostics: list[Diagnostic]
    created_at: str
    accepted_at: str


# ---------------------------------------------------------------- corpora


class FieldMapping(Input, kw_only=True):
    name: LogicalName
    source_pointer: NonEmpty
    type: Literal["string", "number", "boolean", "datetime", "string_array"]
    roles: Annotated[list[Literal["search", "filter"]], Meta(min_length=1)]


class RetrievalConfig(Input, kw_only=True):
    plugin_profile: NonEmpty
    fields: list[FieldMapping]


class CorpusRequest(Input, kw_only=True):
    idempotency_key: NonEmpty
    corpus_id: CorpusIdPattern | None = None
    name: Annotated[str, Meta(min_length=1, max_length=200)]
    retrieval: RetrievalConfig | None = None


class FieldMappingView(Output, kw_only=True):
    name: str
    source_pointer: str
    type: str
    roles: list[str]


class RetrievalView(Output, kw_only=True):
    plugin_profile: str
    fields: list[FieldMappingView]


class Corpus(Output, kw_only=True):
    corpus_id: str
    name: str
    created_at: str
    retrieval: RetrievalView
    projection_generation_id: str
    vector_spaces: list[str]


class CorpusPage(Output, kw_only=True):
    items: list[Corpus]
    next_page_cursor: str | None = None


# ---------------------------------------------------------------- change feed


class ChangeSubject(Output, kw_only=True):
    type: str
    id: str


class ChangeEvent(Output, kw_only=True):
    event_id: str
    kind: str
    corpus_id: str
    subject: ChangeSubject
    committed_at: str
    version_id: str | None = None
    receipt_id: str | None = None


class ChangePage(Output, kw_only=True):
    items: list[ChangeEvent]
    next_cursor: str


class Health(Output, kw_only=True):
    status: str


# ---------------------------------------------------------------- search

ProfileName = Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
NamespaceName = Annotated[str, Meta(min_length=1, max_length=200)]


# Uniqueness is checked by the search service (422 invalid_schema), not by msgspec: stated here for the schema.
UNIQUE = {"uniqueItems": True}


class SearchFilter(Input, kw_only=True):
    source_namespaces: Annotated[list[NamespaceName], Meta(min_length=1, max_length=50, extra_json_schema=UNIQUE)]


class SearchRequest(Input, kw_only=True):
    query: Annotated[str, Meta(min_length=1)]  # 8,192 characters: checked with the profile (query_too_long)
    corpus_ids: Annotated[list[NonEmpty], Meta(min_length=1, max_length=16, extra_json_schema=UNIQUE)]
    mode: Literal["lexical", "semantic", "hybrid"] = "hybrid"
    profile: ProfileName = "default"
    limit: Annotated[int, Meta(ge=1, le=50)] = 10
    filter: SearchFilter | None = None
    idempotency_key: NonEmpty | None = None  # accepted, unused: search changes nothing


class Excerpt(Output, kw_only=True):
    text: str
    start: int
    end: int


class Explanation(Output, kw_only=True):
    lexical_rank: int | None = None
    semantic_rank: int | None = None
    score: float


class SearchHit(Output, kw_only=True):
    rank: int
    record_id: str
    version_id: str
    part_key: str
    excerpt: Excerpt
    explanation: Explanation | None = None


class ProfileRef(Output, kw_only=True):
    name: str
    version: str


class SearchResponse(Output, kw_only=True):
    items: list[SearchHit]
    retrieval_profile: ProfileRef


class SearchProfile(Output, kw_only=True):
    name: str
    version: str
    default: bool
    modes: list[str]
    max_latency_ms: int
    max_query_chars: int


class SearchProfileList(Output, kw_only=True):
    items: list[SearchProfile]


# ---------------------------------------------------------------- uploads and blobs

# type/subtype with optional parameters (RFC 9110 tokens; quoted values allowed).
_TOKEN = r"[A-Za-z0-9!#$%&'*+.^_`|~-]+"
MediaType = Annotated[
    str,
    Meta(
        max_length=255,
        pattern=rf'^{_TOKEN}/{_TOKEN}(\s*;\s*{_TOKEN}=({_TOKEN}|"[^"\\\r\n]*"))*$',
    ),
]
Sha256Hex = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]


class UploadRequest(Input, kw_only=True):
    idempotency_key: NonEmpty
    media_type: MediaType
    size_bytes: Annotated[int, Meta(ge=1)]  # the upper bound is the configured Blob limit (413)
    sha256: Sha256Hex
    filename: Annotated[str, Meta(min_length=1, max_length=255)] | None = None


class ActionRequest(Input, kw_only=True):
    idempotency_key: NonEmpty | None = None


class KeyedActionRequest(Input, kw_only=True):
    """ActionRequest where the key is required: the action creates something (a rebuild, a rerun)."""

    idempotency_key: NonEmpty


class ConfigUpdate(Input, kw_only=True):
    idempotency_key: NonEmpty
    retrieval: RetrievalConfig


class OperationResult(Output, kw_only=True):
    projection_generation_id: str


class Operation(Output, kw_only=True):
    operation_id: str
    kind: str
    state: Literal["queued", "running", "paused", "succeeded", "failed", "cancel_requested", "canceled"]
    progress: float | None = None
    counters: dict[str, int]
    errors: list[Error]
    previous_operation_id: str | None = None
    corpus_id: str | None = None
    result: OperationResult | None = None


class Upload(Output, kw_only=True):
    upload_id: str
    state: Literal["awaiting_upload", "verifying", "verified", "failed"]
    put_url: str
    put_headers: dict[str, str]
    expires_at: str
    media_type: str
    size_bytes: int
    sha256: str
    blob_id: str | None = None
    error: Error | None = None


class Blob(Output, kw_only=True):
    blob_id: str
    media_type: str
    size_bytes: int
    sha256: str
    created_at: str


class VectorSpace(Output, kw_only=True):
    name: str
    owner: str  # "engine" or an ingestion plugin id
    model: str
    dimensions: int
    metric: str
    indexed_modalities: list[str]
    query_modalities: list[str]
    role: Literal["served", "evaluation"]
    coverage: int  # current segments holding a vector in this space


class VectorSpaceList(Output, kw_only=True):
    items: list[VectorSpace]
