"""The connectors slice's journal events (decisions-part2, "Change-feed event kinds added"):
`connector.created`, `connector.changed` (subject `connector`) and `connector.run.changed`
(subject `connector_run`), public, committed in the Connector's Corpus and visible with
`connectors:read`. The change feed shows ids only; the payloads record what moved.

They sit below the journal, like monitoring/events.py, so that `journal/events.py` lists them in
its one catalogue. Member names never change once written.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

CONNECTOR_CREATED = "connector.created"
CONNECTOR_CHANGED = "connector.changed"
CONNECTOR_RUN_CHANGED = "connector.run.changed"

CONNECTOR_SUBJECT = "connector"
RUN_SUBJECT = "connector_run"


class _ConnectorPayload(msgspec.Struct, kw_only=True, tag_field="kind"):
    public: ClassVar[bool] = True


class ConnectorCreated(_ConnectorPayload, kw_only=True, tag=CONNECTOR_CREATED):
    connector_id: str
    connector_kind: str
    source_namespace: str
    created_at: str


class ConnectorChanged(_ConnectorPayload, kw_only=True, tag=CONNECTOR_CHANGED):
    """A disable, a credential replacement, a schedule change, or a move of health.state or
    health.push.state (decisions-part2 "Runs": committed only when one of those states moves)."""

    connector_id: str
    change: str  # disabled, credential_replaced, schedule_changed, health
    health_state: str | UnsetType = UNSET
    details: dict[str, Any] | UnsetType = UNSET
    changed_at: str


class ConnectorRunChanged(_ConnectorPayload, kw_only=True, tag=CONNECTOR_RUN_CHANGED):
    connector_id: str
    run_id: str
    state: str  # queued, running, succeeded, failed, skipped
    pages: int = 0
    receipts_created: int = 0
    error_code: str | UnsetType = UNSET
    changed_at: str


CONNECTOR_PUSH_RECEIVED = "connector.push.received"
CONNECTOR_PUSH_REFUSED = "connector.push.refused"


class _PushAudit(_ConnectorPayload, kw_only=True):
    """One attempt on a push route or the relay of an existing Connector (part 2 rule 11)."""

    connector_id: str
    route: str  # the declared route's name, or `relay`
    method: str
    status: int
    code: str | UnsetType = UNSET
    client_ip: str
    at: str


class ConnectorPushReceived(_PushAudit, kw_only=True, tag=CONNECTOR_PUSH_RECEIVED):
    pass


class ConnectorPushRefused(_PushAudit, kw_only=True, tag=CONNECTOR_PUSH_REFUSED):
    pass
