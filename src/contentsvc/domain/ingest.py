"""Ingest and withdrawal commands become journal events (pure).

Acceptance checks the command against what it can see without history
(shape, Part keys, whether a route reads each Blob's media type); the
command transaction then checks that each referenced Blob is verified
(commands.py); the materializer decides the outcome later, in journal
order.
"""

from __future__ import annotations

from typing import Any

import msgspec

from contentsvc.domain.models import BlobContent, IngestCommand, ManifestContent, WithdrawalCommand
from contentsvc.domain.normalize import text_route_refusal
from contentsvc.domain.errors import ApiError
from contentsvc.domain.extensions import check_extensions
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent


def check_ingest(cmd: IngestCommand, routed: frozenset[str] = frozenset()) -> None:
    """Rules that the Struct types cannot state; raises 422 with a pointer. `routed`: the media
    types the active plan sends to a normalizer plugin (besides the built-in text path's text/*)."""
    if isinstance(cmd.content, ManifestContent):
        seen: set[str] = set()
        for i, part in enumerate(cmd.content.parts):
            check_extensions(part.extensions, f"/content/parts/{i}/extensions")
            if part.key in seen:
                raise ApiError(422, "invalid_schema", f"Part key {part.key!r} is not unique.",
                               field=f"/content/parts/{i}/key")
            if part.parent_key is not None and part.parent_key not in seen:
                raise ApiError(422, "invalid_schema", "parent_key must name an earlier Part.",
                               field=f"/content/parts/{i}/parent_key")
            seen.add(part.key)
        if cmd.title is not None and "title" in seen:
            raise ApiError(422, "invalid_schema", "A title is given and a Part is already keyed 'title'.",
                           field="/title")
    check_extensions(cmd.extensions, "/extensions")
    for pointer, blob in blob_references(cmd):
        if base_media_type(blob.media_type) in routed:
            continue
        refusal = text_route_refusal(blob.media_type)
        if refusal is not None:
            raise ApiError(422, "unsupported_media_type", refusal, field=f"{pointer}/media_type")


def base_media_type(media_type: str) -> str:
    """The media type without parameters, lowercase: what a `normalizer:<media type>` role names."""
    return media_type.split(";", 1)[0].strip().lower()


def blob_references(cmd: IngestCommand) -> list[tuple[str, BlobContent]]:
    """(JSON Pointer of the BlobContent, the BlobContent) for each Blob the command references."""
    if isinstance(cmd.content, BlobContent):
        return [("/content", cmd.content)]
    if isinstance(cmd.content, ManifestContent):
        return [(f"/content/parts/{i}/content", part.content) for i, part in enumerate(cmd.content.parts)
                if isinstance(part.content, BlobContent)]
    return []


def unverified_blob(field: str) -> ApiError:
    return ApiError(422, "unverified_blob", "The referenced Blob is unknown or not verified: create an upload, PUT "
                    "its bytes, confirm it and poll until it is verified.", field=field)


def _source(cmd: IngestCommand | WithdrawalCommand) -> ev.Source:
    s = cmd.source
    return ev.Source(corpus_id=s.corpus_id, namespace=s.namespace, record_key=s.record_key)


def _accepted(org_id: str, cmd: IngestCommand | WithdrawalCommand, payload: ev.IngestAccepted | ev.WithdrawalAccepted
              ) -> NewEvent:
    """A source command accepted under its Receipt: the event the materializer reads."""
    return NewEvent(org_id=org_id, corpus_id=cmd.source.corpus_id, subject_type="receipt",
                    subject_id=payload.receipt_id, receipt_id=payload.receipt_id, payload=payload)


def ingest_accepted(org_id: str, cmd: IngestCommand, receipt_id: str, accepted_at: str,
                    blobs: dict[str, ev.VerifiedBlob] | None = None) -> NewEvent:
    """blobs: the verified Blobs the command references, by blob_id, so that the
    materializer can tell whether a Blob is still the verified accepted input."""
    provenance: dict[str, Any] = msgspec.to_builtins(cmd.provenance) if cmd.provenance else {"origin": "client"}
    provenance["accepted_at"] = accepted_at
    return _accepted(org_id, cmd, ev.IngestAccepted(
        receipt_id=receipt_id,
        source=_source(cmd),
        content=msgspec.to_builtins(cmd.content),
        title=cmd.title,
        provenance=provenance,
        extensions=msgspec.to_builtins(cmd.extensions) if cmd.extensions else None,
        relations=msgspec.to_builtins(cmd.relations or []),
        accepted_at=accepted_at,
        blobs=blobs or msgspec.UNSET,
    ))


def withdrawal_accepted(org_id: str, cmd: WithdrawalCommand, receipt_id: str, accepted_at: str) -> NewEvent:
    return _accepted(org_id, cmd, ev.WithdrawalAccepted(receipt_id=receipt_id, source=_source(cmd),
                                                        reason=cmd.reason, accepted_at=accepted_at))
