"""How far a Version has come, as Receipts and Versions show it: availability and the
live processing summary (baseline until searchable, then enrichment until its vectors exist)."""

from __future__ import annotations

from contentsvc.domain.models import (
    Availability,
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


def version_processing(state: str | None, awaits_vectors: bool = False, is_current: bool = True) -> ProcessingSummary:
    """Live processing view of a Version: baseline until searchable, then enrichment until its
    vectors exist (when its Corpus has a vector space), then idle. A Version that ended
    without serving (quarantined, or `retrieval_ready` and replaced) has nothing pending:
    idle, so a client following its Receipt stops (part 1, "States and transitions")."""
    if state == "retrieval_ready" and awaits_vectors and is_current:
        return QUEUED_FOR_ENRICHMENT
    return _PROCESSING_BY_AVAILABILITY.get(state or "", IDLE)
