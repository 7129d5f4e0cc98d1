"""Ingest and withdrawal commands become journal events (pure).

Acceptance checks the command against what it can see without history
(shape, Part keys); the materializer decides the outcome later, in journal
order.
"""

from __future__ import annotations

from typing import Any

import msgspec

from contentsvc.domain.models import BlobContent, IngestCommand, ManifestContent, WithdrawalCommand
from contentsvc.errors import ApiError
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent


def check_ingest(cmd: IngestCommand) -> None:
    """Rules that the Struct types cannot state; raises 422 with a pointer."""
    if isinstance(cmd.content, ManifestContent):
        seen: set[str] = set()
        for i, part in enumerate(cmd.content.parts):
            if part.key in seen:
                raise ApiError(422, "invalid_schema", f"Part key {part.key!r} is not unique.",
                               field=f"/content/parts/{i}/key")
            if part.parent_key is not None and part.parent_key not in seen:
                raise ApiError(422, "invalid_schema", "parent_key must name an earlier Part.",
                               field=f"/content/parts/{i}/parent_key")
            seen.add(part.key)
            if isinstance(part.content, BlobContent):
                raise _unverified(f"/content/parts/{i}/content/blob_id")
        if cmd.title is not None and "title" in seen:
            raise ApiError(422, "invalid_schema", "A title is given and a Part is already keyed 'title'.",
                           field="/title")
    elif isinstance(cmd.content, BlobContent):
        raise _unverified("/content/blob_id")


def _unverified(field: str) -> ApiError:
    return ApiError(422, "unverified_blob", "The referenced Blob is unknown or not verified.", field=field)


def ingest_accepted(org_id: str, cmd: IngestCommand, receipt_id: str, accepted_at: str) -> NewEvent:
    provenance: dict[str, Any] = msgspec.to_builtins(cmd.provenance) if cmd.provenance else {"origin": "client"}
    provenance["accepted_at"] = accepted_at
    return NewEvent(
        kind=ev.INGEST_ACCEPTED,
        org_id=org_id,
        corpus_id=cmd.source.corpus_id,
        subject_type="receipt",
        subject_id=receipt_id,
        receipt_id=receipt_id,
        payload={
            "receipt_id": receipt_id,
            "source": msgspec.to_builtins(cmd.source),
            "content": msgspec.to_builtins(cmd.content),
            "title": cmd.title,
            "provenance": provenance,
            "extensions": msgspec.to_builtins(cmd.extensions) if cmd.extensions else None,
            "relations": msgspec.to_builtins(cmd.relations or []),
            "accepted_at": accepted_at,
        },
    )


def withdrawal_accepted(org_id: str, cmd: WithdrawalCommand, receipt_id: str, accepted_at: str) -> NewEvent:
    return NewEvent(
        kind=ev.WITHDRAWAL_ACCEPTED,
        org_id=org_id,
        corpus_id=cmd.source.corpus_id,
        subject_type="receipt",
        subject_id=receipt_id,
        receipt_id=receipt_id,
        payload={
            "receipt_id": receipt_id,
            "source": msgspec.to_builtins(cmd.source),
            "reason": cmd.reason,
            "accepted_at": accepted_at,
        },
    )
