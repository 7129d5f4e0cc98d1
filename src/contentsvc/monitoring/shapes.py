"""Requests and answers of the Saved Query and Subscription routes (part 2 "Saved queries and
subscriptions"; decisions-part2 "Monitoring" > "Saved queries", "Subscriptions"), and the checks
of them that need nothing but the request and an evaluator's declared schemas.

Pure: no I/O.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from contentsvc.domain.errors import ApiError, invalid_schema
from contentsvc.domain.models import UNIQUE, Input, NonEmpty, Output
from contentsvc.plugins.manifest import validate_against

IdempotencyKey = Annotated[str, Meta(min_length=1, max_length=256)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]  # decisions-part2: names are 1..200 chars
# decisions-part2: 1..16 unique (check_corpus_ids answers a repeat; stated here for the schema)
CorpusIds = Annotated[list[NonEmpty], Meta(min_length=1, max_length=16, extra_json_schema=UNIQUE)]
MAX_EXPRESSION_BYTES = 64 * 1024  # decisions-part2: an expression is at most 64 KiB serialized
MAX_OWNER_CHARS = 128  # part 2 Subscription Version: owner 1..128 chars
GLOBAL_OWNER = "none"  # the listSubscriptions filter value for global Subscriptions; no owner may be it

PAGE_MAX = 100
PAGE_DEFAULT = 20


# ---------------------------------------------------------------- requests


class SavedQueryCreate(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    name: Name
    corpus_ids: CorpusIds
    expression: dict[str, Any]


class SavedQueryVersionCreate(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    expression: dict[str, Any]
    corpus_ids: CorpusIds | None = None  # omitted: the current scope


class RenameRequest(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    name: Name


class EvaluatorPin(Input, kw_only=True):
    plugin_id: Annotated[str, Meta(min_length=1, max_length=256)]
    version: Annotated[str, Meta(min_length=1, max_length=256)]
    configuration: dict[str, Any] = msgspec.field(default_factory=dict)


class SubscriptionCreate(Input, kw_only=True):
    idempotency_key: IdempotencyKey
    name: Name
    saved_query_version_id: NonEmpty
    evaluator: EvaluatorPin
    destination_id: NonEmpty
    # Checked by `check_owner` (422 invalid_owner), not here, so the contract's code answers; the
    # served document still states the length.
    owner: Annotated[str, Meta(extra_json_schema={"minLength": 1, "maxLength": MAX_OWNER_CHARS})] | None = None


class SubscriptionVersionCreate(Input, kw_only=True):
    """An `owner` member is unknown here (422 invalid_schema): every Version keeps the Subscription's."""

    idempotency_key: IdempotencyKey
    saved_query_version_id: NonEmpty
    evaluator: EvaluatorPin
    destination_id: NonEmpty


# ---------------------------------------------------------------- answers


class SavedQuery(Output, kw_only=True):
    saved_query_id: str
    name: str
    corpus_ids: list[str]
    current_version_id: str
    deleted: bool
    created_at: str
    updated_at: str


class SavedQueryVersion(Output, kw_only=True):
    version_id: str
    saved_query_id: str
    corpus_ids: list[str]
    expression: dict[str, Any]
    created_at: str


class EvaluatorView(Output, kw_only=True):
    plugin_id: str
    version: str
    configuration: dict[str, Any]


class EvaluationView(Output, kw_only=True):
    """What the `monitor` worker reports; until it runs, nothing is pending."""

    pending: int
    last_evaluated_at: str | None = None
    last_error: dict[str, Any] | None = None


class Subscription(Output, kw_only=True):
    subscription_id: str
    name: str
    saved_query_id: str
    current_version_id: str
    enabled: bool
    deleted: bool
    created_at: str
    updated_at: str
    evaluation: EvaluationView
    owner: str | None = None
    disabled_reason: str | None = None


class SubscriptionVersion(Output, kw_only=True):
    subscription_id: str
    version_id: str
    saved_query_id: str
    saved_query_version_id: str
    evaluator: EvaluatorView
    destination_id: str
    created_at: str
    activated_at: str
    owner: str | None = None


class SubscriptionPage(Output, kw_only=True):
    items: list[Subscription]
    next_page_cursor: str | None = None


# ---------------------------------------------------------------- checks


def check_corpus_ids(corpus_ids: list[str]) -> None:
    if len(set(corpus_ids)) != len(corpus_ids):
        raise invalid_schema("corpus_ids must be unique.", "/corpus_ids")


def check_expression(expression: dict[str, Any]) -> None:
    """Any JSON object, at most 64 KiB serialized; the service never interprets it."""
    if len(msgspec.json.encode(expression)) > MAX_EXPRESSION_BYTES:
        raise invalid_schema(f"expression may be at most {MAX_EXPRESSION_BYTES} bytes serialized.", "/expression")


def check_owner(owner: str | None) -> None:
    """part 2 Subscription Version `owner` and decisions-part2 "Subscriptions": 1..128 chars, no
    control characters, not the literal `none` (the filter's name for global Subscriptions)."""
    if owner is None:
        return
    if not 1 <= len(owner) <= MAX_OWNER_CHARS:
        raise invalid_owner(f"owner must be 1 to {MAX_OWNER_CHARS} characters.")
    if any(unicodedata.category(c) == "Cc" for c in owner):
        raise invalid_owner("owner may not contain control characters.")
    if owner == GLOBAL_OWNER:
        raise invalid_owner(f"owner may not be {GLOBAL_OWNER!r}: it names global Subscriptions in the list filter.")


def invalid_owner(message: str) -> ApiError:
    return ApiError(422, "invalid_owner", message, field="/owner")


def check_against_evaluator(expression_schema: Any, configuration_schema: Any, expression: dict[str, Any],
                            configuration: dict[str, Any]) -> None:
    """part 2 rule 6: the pinned expression against the evaluator's `expression_schema`
    (422 invalid_expression, field /saved_query_version_id), then the configuration against its
    `configuration_schema` (422 invalid_subscription_configuration, field /evaluator/configuration/...);
    each message names the first schema issue."""
    issues = validate_against(expression_schema, expression)
    if issues:
        first = issues[0]
        raise ApiError(422, "invalid_expression",
                       f"The Saved Query Version's expression does not satisfy the evaluator's expression_schema "
                       f"at {first.pointer or '/'}: {first.message}", field="/saved_query_version_id")
    issues = validate_against(configuration_schema, configuration)
    if issues:
        first = issues[0]
        raise ApiError(422, "invalid_subscription_configuration",
                       f"The evaluator configuration does not satisfy the evaluator's configuration_schema at "
                       f"{first.pointer or '/'}: {first.message}", field="/evaluator/configuration" + first.pointer)
