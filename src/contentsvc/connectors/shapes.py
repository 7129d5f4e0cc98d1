"""Request and response bodies of the connector routes (part 2 "Connector", "Credential
bodies", "Connector management"; decisions-part2 "Connectors")."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from msgspec import Meta

from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import Input, NonEmpty, Output

Namespace = Annotated[str, Meta(min_length=1, max_length=200)]
PAGE_DEFAULT, PAGE_MAX = 20, 100


def webhook_url(public_base_url: str, connector_id: str) -> str:
    """A push kind's relay address (decisions-part2 "Create, read, list")."""
    return f"{public_base_url}/v0/connector-webhooks/{connector_id}"


def connector_disabled() -> ApiError:
    return ApiError(409, "connector_disabled", "The Connector is disabled; disabling is final in v0.")


# An RFC 3339 date-time, as the served document says; one without an offset is taken as UTC.
Instant = Annotated[datetime, Meta(extra_json_schema={
    "format": "date-time", "description": "RFC 3339 date-time; without an offset it is UTC"})]


class Schedule(Input, kw_only=True):
    interval_seconds: int


class HealthPolicy(Input, kw_only=True):
    silent_after_seconds: int | None = None
    credential_warning_seconds: int | None = None


class PushPolicy(Input, kw_only=True):
    allowed_cidrs: list[str] | None = None
    rate_per_second: float | None = None
    burst: int | None = None


class CredentialDeposit(Input, kw_only=True):
    secret: dict[str, Any]
    expires_at: Instant | None = None


class CredentialReplace(Input, kw_only=True):
    idempotency_key: NonEmpty
    secret: dict[str, Any]
    expires_at: Instant | None = None


class ConnectorCreate(Input, kw_only=True):
    idempotency_key: NonEmpty
    corpus_id: NonEmpty
    source_namespace: Namespace
    kind: NonEmpty
    config: dict[str, Any]
    schedule: Schedule | None = None
    health_policy: HealthPolicy | None = None
    credential: CredentialDeposit | None = None
    push_policy: PushPolicy | None = None


class RunRequest(Input, kw_only=True):
    idempotency_key: NonEmpty


class CredentialMetadata(Output, kw_only=True):
    version: int
    deposited_at: str
    expires_at: str | None = None


class Connector(Output, kw_only=True):
    connector_id: str
    corpus_id: str
    source_namespace: str
    kind: str
    config: dict[str, Any]
    schedule: dict[str, int]
    health_policy: dict[str, int]
    enabled: bool
    created_at: str
    health: dict[str, Any]
    disabled_at: str | None = None
    credential: CredentialMetadata | None = None
    webhook_url: str | None = None
    next_run_at: str | None = None
    push_policy: dict[str, Any] | None = None
    push_counters: dict[str, Any] | None = None


class ConnectorPage(Output, kw_only=True):
    items: list[Connector]
    next_page_cursor: str | None = None


class ConnectorKindDescription(Output, kw_only=True):
    kind: str
    title: str
    description: str
    config_schema: dict[str, Any]
    credential: Literal["none", "optional", "required"]
    default_interval_seconds: int
    credential_schema: dict[str, Any] | None = None


class ConnectorKinds(Output, kw_only=True):
    items: list[ConnectorKindDescription]
    credential_deposits: bool


class Run(Output, kw_only=True):
    run_id: str
    connector_id: str
    trigger: Literal["schedule", "request"]
    state: Literal["queued", "running", "succeeded", "failed", "skipped"]
    pages: int
    items_seen: int
    receipts_created: int
    items_rejected: int
    run_at: str
    plan_id: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    error: dict[str, Any] | None = None
    notice: str | None = None


class RunPage(Output, kw_only=True):
    items: list[Run]
    next_page_cursor: str | None = None


class RunAccepted(Output, kw_only=True):
    connector_id: str
    run_id: str
    run_at: str


class InstanceTokenCreate(Input, kw_only=True):
    idempotency_key: NonEmpty
    name: Annotated[str, Meta(min_length=1, max_length=200)] | None = None
    expires_at: Instant | None = None


class InstanceToken(Output, kw_only=True):
    token_id: str
    connector_id: str
    created_at: str
    name: str | None = None
    expires_at: str | None = None
    revoked_at: str | None = None
    secret: str | None = None  # only in the answer that created it


class InstanceTokenList(Output, kw_only=True):
    items: list[InstanceToken]


class PushAccepted(Output, kw_only=True):
    receipts: list[dict[str, Any]]
