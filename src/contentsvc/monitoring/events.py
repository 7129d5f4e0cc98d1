"""The monitoring slice's journal events for Saved Queries and Subscriptions (part 2 "Saved
queries and subscriptions", "Events"; decisions-part2 "Monitoring", "Change-feed event kinds added").

Two sorts, like part 1's:

- Internal facts, one per command that changes something: `saved_query.committed` and
  `subscription.committed` carry the resource's head as the command left it (name, current
  Version, enabled, deleted ...) with a per-resource `revision`, and the new Version when the
  command made one. The read tables are their fold (monitoring/views.py); the head is a snapshot,
  so a fold keeps the highest revision and never needs the events in between.
- Public change events, ids only, committed once in each Corpus the rule names:
  `saved_query.updated|deleted|renamed`, `subscription.updated|deleted|renamed` (the `*.updated`
  kinds also mean "created"). Their subject is the Saved Query or Subscription.

They sit below the journal so that `journal/events.py` lists them in its one catalogue; member
names never change once written.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

Timestamp = str  # RFC 3339, UTC
JsonObject = dict[str, Any]

SAVED_QUERY_COMMITTED = "saved_query.committed"
SAVED_QUERY_UPDATED = "saved_query.updated"
SAVED_QUERY_DELETED = "saved_query.deleted"
SAVED_QUERY_RENAMED = "saved_query.renamed"
SUBSCRIPTION_COMMITTED = "subscription.committed"
SUBSCRIPTION_UPDATED = "subscription.updated"
SUBSCRIPTION_DELETED = "subscription.deleted"
SUBSCRIPTION_RENAMED = "subscription.renamed"

SAVED_QUERY_SUBJECT = "saved_query"
SUBSCRIPTION_SUBJECT = "subscription"


class _MonitoringPayload(msgspec.Struct, kw_only=True, tag_field="kind"):
    public: ClassVar[bool] = False


# ---------------------------------------------------------------- internal facts


class SavedQueryVersionFact(msgspec.Struct, kw_only=True):
    version_id: str
    corpus_ids: list[str]
    expression: JsonObject  # the client's JSON object, never interpreted
    created_at: Timestamp


class SavedQueryCommitted(_MonitoringPayload, kw_only=True, tag=SAVED_QUERY_COMMITTED):
    """A Saved Query's head after a create, new Version, rename or delete."""

    saved_query_id: str
    revision: int  # 1 at creation, one more per later change
    name: str
    current_version_id: str
    corpus_ids: list[str]  # the current Version's
    deleted: bool
    created_at: Timestamp
    updated_at: Timestamp
    version: SavedQueryVersionFact | UnsetType = UNSET  # the Version this change created


class Evaluator(msgspec.Struct, kw_only=True):
    plugin_id: str
    version: str
    configuration: JsonObject


class SubscriptionVersionFact(msgspec.Struct, kw_only=True):
    version_id: str
    saved_query_id: str
    saved_query_version_id: str
    evaluator: Evaluator
    destination_id: str
    corpus_ids: list[str]  # the pinned Saved Query Version's
    created_at: Timestamp
    activated_at: Timestamp  # its commit; the event's journal position is its activation position


class SubscriptionCommitted(_MonitoringPayload, kw_only=True, tag=SUBSCRIPTION_COMMITTED):
    """A Subscription's head after a create, new Version, rename, disable, enable or delete."""

    subscription_id: str
    revision: int
    name: str
    saved_query_id: str
    current_version_id: str
    enabled: bool
    deleted: bool
    scope: list[str]  # every Corpus any of its Versions pinned (rule 8)
    created_at: Timestamp
    updated_at: Timestamp
    owner: str | UnsetType = UNSET  # absent: a global Subscription
    disabled_reason: str | UnsetType = UNSET  # "disabled" or "subscription_deleted"
    version: SubscriptionVersionFact | UnsetType = UNSET


# ---------------------------------------------------------------- public change events (ids only)


class _SavedQueryChange(_MonitoringPayload, kw_only=True):
    public = True
    saved_query_id: str


class SavedQueryUpdated(_SavedQueryChange, kw_only=True, tag=SAVED_QUERY_UPDATED):
    pass


class SavedQueryDeleted(_SavedQueryChange, kw_only=True, tag=SAVED_QUERY_DELETED):
    pass


class SavedQueryRenamed(_SavedQueryChange, kw_only=True, tag=SAVED_QUERY_RENAMED):
    pass


class _SubscriptionChange(_MonitoringPayload, kw_only=True):
    public = True
    subscription_id: str


class SubscriptionUpdated(_SubscriptionChange, kw_only=True, tag=SUBSCRIPTION_UPDATED):
    pass


class SubscriptionDeleted(_SubscriptionChange, kw_only=True, tag=SUBSCRIPTION_DELETED):
    pass


class SubscriptionRenamed(_SubscriptionChange, kw_only=True, tag=SUBSCRIPTION_RENAMED):
    pass


MONITORING_PAYLOADS = (SavedQueryCommitted, SubscriptionCommitted, SavedQueryUpdated, SavedQueryDeleted,
                       SavedQueryRenamed, SubscriptionUpdated, SubscriptionDeleted, SubscriptionRenamed)
