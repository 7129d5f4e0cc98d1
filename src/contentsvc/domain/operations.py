"""Operations: their states, how reported moves merge, their events, and the cutover verdict.

An Operation's public document is a fold of `operation.changed` events,
each carrying the members that moved. Pure functions only: the read-model
fold (SQL) and the in-batch merge (Python) follow the same rules, which a
property test checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from contentsvc.ids import new_id
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent

PROJECTION_REBUILD = "projection_rebuild"
RETRIEVAL_CONFIGURATION = "retrieval_configuration"

# What the command that starts an Operation of each kind needs (part 1 Endpoints); a rerun
# of the Operation needs it again (rule 11: command eligibility is revalidated).
STARTED_WITH = {
    RETRIEVAL_CONFIGURATION: ("corpora:write", "operations:write"),
    PROJECTION_REBUILD: ("projections:rebuild",),
}

TERMINAL = frozenset({"succeeded", "failed", "canceled"})
ACTIVE = frozenset({"queued", "running"})

OPERATION_SUPERSEDED = "operation_superseded"
CONFIGURATION_SUPERSEDED = "retrieval_configuration_superseded"


def merge(current: dict[str, Any], moved: dict[str, Any]) -> dict[str, Any]:
    """The Operation after a reported move (part 1, state table).

    A terminal Operation never changes again (a cancel that lost the race to a
    completion leaves the completion). Once cancellation is requested, work
    reports (queued, running, progress) do not hide the request; only a
    terminal state replaces it.
    """
    state = current.get("state")
    if state in TERMINAL:
        return current
    out = {**current, **moved}
    if state == "cancel_requested" and out.get("state") in ACTIVE:
        out["state"] = "cancel_requested"
    return out


def changed(org_id: str, corpus_id: str, operation_id: str, moved: dict[str, Any],
            request: ev.OperationRequest | None = None) -> NewEvent:
    """The `operation.changed` event reporting `moved` (members of the Operation); an acceptance
    also carries the request the lexical projector acts on (kept out of the public Operation)."""
    payload = ev.OperationChanged(operation=ev.OperationMoves(operation_id=operation_id, **moved),
                                  request=UNSET if request is None else request)
    return NewEvent(org_id=org_id, corpus_id=corpus_id, subject_type="operation", subject_id=operation_id,
                    payload=payload)


def projection_generation_for(operation_id: str) -> str:
    """The generation an Operation builds, derived from its id: a retry of the same
    Operation targets the same generation (part 1 rule 17)."""
    return "gen_" + operation_id.split("_", 1)[1]


def new_operation_id() -> str:
    return new_id("op")


@dataclass(frozen=True)
class Build:
    """What a cutover decision needs to know about a generation."""

    operation_kind: str | None
    accepted_position: int  # acceptance of its Operation (or of the Corpus)
    config_position: int  # acceptance of the retrieval configuration it is pinned to


def cutover_verdict(candidate: Build, serving: Build) -> str | None:
    """None when the candidate may activate; else the error code it fails with.

    - A generation pinned to an older configuration than the effective one never
      activates: the effective configuration is not reverted.
    - Rebuilds activate in acceptance order: one accepted earlier than the
      rebuild already activated for the same configuration is superseded.
    """
    if candidate.config_position < serving.config_position:
        return CONFIGURATION_SUPERSEDED
    if (candidate.operation_kind == PROJECTION_REBUILD and serving.operation_kind == PROJECTION_REBUILD
            and candidate.config_position == serving.config_position
            and candidate.accepted_position < serving.accepted_position):
        return OPERATION_SUPERSEDED
    return None


ERROR_MESSAGES = {
    OPERATION_SUPERSEDED: "A rebuild accepted later has already been activated for this Corpus.",
    CONFIGURATION_SUPERSEDED: "A newer retrieval configuration was accepted for this Corpus; this one never takes effect.",
}
RERUN_SUPERSEDED_MESSAGE = ("A different retrieval configuration was accepted for this Corpus after this one; rerunning "
                            "it would revert that one. Send it again with configureRetrieval to make it effective.")


def error(code: str) -> dict[str, Any]:
    return {"code": code, "message": ERROR_MESSAGES[code], "retryable": False}
