"""How far a Version has come, as Receipts and Versions show it: availability and the
live processing summary (baseline until searchable, then enrichment until its vectors exist,
`blocked` while that enrichment needs an operator), with the diagnostics that say why."""

from __future__ import annotations

from contentsvc.config.limits import MAX_DIAGNOSTICS
from contentsvc.domain.models import (
    Availability,
    Diagnostic,
    ProcessingSummary,
)

QUEUED_FOR_MATERIALIZATION = ProcessingSummary(state="queued", phase="materialization")
IDLE = ProcessingSummary(state="idle")


def availability_view(state: str | None, searchable: bool | None, is_current: bool) -> Availability | None:
    if state is None:
        return None
    return Availability(state=state, is_current=is_current, searchable=bool(searchable) and is_current)


_PROCESSING_BY_AVAILABILITY = {
    "materialized": ProcessingSummary(state="queued", phase="baseline"),
    "building_baseline": ProcessingSummary(state="running", phase="baseline"),
}


QUEUED_FOR_ENRICHMENT = ProcessingSummary(state="queued", phase="enrichment")


def version_processing(state: str | None, awaits_vectors: bool = False, is_current: bool = True,
                       enrichment_blocked: dict | None = None) -> ProcessingSummary:
    """Live processing view of a Version: baseline until searchable, then enrichment until its
    vectors exist (when its Corpus has a vector space), then idle. Enrichment that needs an
    operator is `blocked` (part 1 ProcessingSummary), its diagnostic saying why. A Version that
    ended without serving (quarantined, or `retrieval_ready` and replaced) has nothing pending:
    idle, so a client following its Receipt stops (part 1, "States and transitions")."""
    if state == "retrieval_ready" and awaits_vectors and is_current:
        if enrichment_blocked is not None:
            return ProcessingSummary(state="blocked", phase="enrichment", message=enrichment_blocked["message"])
        return QUEUED_FOR_ENRICHMENT
    return _PROCESSING_BY_AVAILABILITY.get(state or "", IDLE)


def live_diagnostics(recorded: list[dict], processing: ProcessingSummary,
                     enrichment_blocked: dict | None) -> list[Diagnostic]:
    """The diagnostics recorded with the Version, and while its processing is blocked the one
    that says why (last, within the contract's 20)."""
    diagnostics = [Diagnostic(**d) for d in recorded]
    if processing.state == "blocked" and enrichment_blocked is not None:
        diagnostics = diagnostics[:MAX_DIAGNOSTICS - 1] + [Diagnostic(**enrichment_blocked)]
    return diagnostics
