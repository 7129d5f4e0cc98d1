"""One fetched page, checked and turned into commands (decisions-part2 "Runs", part 2 plugin
protocol "fetch response"; the built-in `fixture` kind's own fetch). Pure: no I/O, no clock.

An answer breaking the protocol (too many items, no checkpoint, `more` without a moved
checkpoint, a checkpoint over the kind's limit) fails the run and moves nothing; an item the
ingestion rules refuse is counted in `items_rejected` and skipped, the rest of the page kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from contentsvc.domain.decoding import nul_pointer
from contentsvc.domain.models import (
    Content,
    Extension,
    IngestCommand,
    ManifestContent,
    Part,
    Provenance,
    SourceIdentity,
    TextContent,
    WithdrawalCommand,
)
from contentsvc.plugins.client import retry_after
from contentsvc.storage.text import storable

MAX_PAGE_ITEMS = 1000
MAX_ATTACHMENTS = 64
MAX_DIAGNOSTICS_BYTES = 16 * 1024


class RunFailure(Exception):
    """Ends a run `failed` with {code, message, error_class?}; the checkpoint stays where it was."""

    def __init__(self, code: str, message: str, error_class: str | None = None,
                 retry_after_seconds: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.error_class = code, message, error_class
        self.retry_after_seconds = retry_after_seconds

    def error(self) -> dict[str, str]:
        out = {"code": self.code, "message": self.message[:1024]}
        if self.error_class is not None:
            out["error_class"] = self.error_class
        return out


@dataclass
class Page:
    items: list[dict[str, Any]]
    checkpoint: Any
    more: bool = False
    not_due: bool = False
    notice: str | None = None
    reads: int = 0
    diagnostics: dict[str, Any] | None = None
    push: dict[str, Any] | None = None
    retry_after_seconds: int | None = None
    rejected: list[int] = field(default_factory=list)  # indexes of items refused at this stage


def _invalid(message: str) -> RunFailure:
    return RunFailure("invalid_plugin_output", message)


def _bounded_string(value: Any, low: int, high: int) -> bool:
    return isinstance(value, str) and low <= len(value) <= high


def check_page(answer: Any, previous_checkpoint: Any, max_items: int, max_checkpoint_bytes: int) -> Page:
    if not isinstance(answer, dict):
        raise _invalid("the fetch answer is not a JSON object")
    items = answer.get("items", [])
    if not isinstance(items, list) or len(items) > min(MAX_PAGE_ITEMS, max_items):
        raise _invalid(f"items must be a list of at most {min(MAX_PAGE_ITEMS, max_items)}")
    if "checkpoint" not in answer:
        raise _invalid("the fetch answer has no checkpoint")
    # Its checkpoint, notice and push state are stored as they are, and no stored text holds U+0000
    # (an item holding it is only that item's refusal: item_commands).
    if (at := nul_pointer(answer, skip=frozenset({"items", "diagnostics"}))) is not None:
        raise _invalid(f"the fetch answer holds U+0000 at {storable(at)}")
    checkpoint = answer["checkpoint"]
    if len(msgspec.json.encode(checkpoint)) > max_checkpoint_bytes:
        raise RunFailure("checkpoint_too_large", f"the checkpoint exceeds {max_checkpoint_bytes} bytes serialized")
    page = Page(items=[], checkpoint=checkpoint, more=answer.get("more") is True,
                not_due=answer.get("not_due") is True)
    if page.not_due:
        page.more = False
        page.checkpoint = previous_checkpoint
        return page
    if page.more and checkpoint == previous_checkpoint:
        raise RunFailure("checkpoint_not_advanced", "the plugin answered more with the checkpoint unchanged")
    notice = answer.get("notice")
    if notice is not None:
        if not _bounded_string(notice, 1, 64):
            raise _invalid("notice must be a string of at most 64 characters")
        page.notice = notice
    reads = answer.get("reads", 0)
    page.reads = reads if isinstance(reads, int) and reads >= 0 else 0
    diagnostics = answer.get("diagnostics")
    if isinstance(diagnostics, dict) and len(msgspec.json.encode(diagnostics)) <= MAX_DIAGNOSTICS_BYTES \
            and nul_pointer(diagnostics) is None:
        page.diagnostics = diagnostics
    if isinstance(answer.get("push"), dict):
        page.push = answer["push"]
    page.retry_after_seconds = retry_after(answer.get("retry_after_seconds"))
    for n, item in enumerate(items):
        page.items.append(item if isinstance(item, dict) else {})
        if not _item_shape_ok(page.items[-1]):
            page.rejected.append(n)
    return page


def _item_shape_ok(item: dict[str, Any]) -> bool:
    attachments = item.get("attachments") or []
    return (_bounded_string(item.get("record_key"), 1, 1024) and _bounded_string(item.get("revision"), 1, 256)
            and (item.get("withdraw") is True or "content" in item)
            and ("source_position" not in item or _bounded_string(item.get("source_position"), 1, 256))
            and isinstance(attachments, list) and len(attachments) <= MAX_ATTACHMENTS
            and all(attachment_shape_ok(a) for a in attachments))


def attachment_shape_ok(attachment: Any) -> bool:
    def text(name: str, low: int, high: int, required: bool = True) -> bool:
        value = attachment.get(name)
        return (value is None and not required) or (isinstance(value, str) and low <= len(value) <= high)
    return isinstance(attachment, dict) and text("key", 1, 256) and text("role", 1, 64) \
        and text("media_type", 1, 255) and text("ref", 1, 1024) and text("parent_key", 1, 256, required=False) \
        and isinstance(attachment.get("extensions", {}), dict)



def item_key(connector_id: str, item: dict[str, Any]) -> str:
    """Pull and push items of one revision share this key: they converge on one Receipt."""
    return f"con:{connector_id}:{item['record_key']}:{item['revision']}"


def item_command(connector: dict[str, Any], producer: str, producer_version: str | None,
                 item: dict[str, Any], blob_parts: list[Part] | None = None) -> IngestCommand | WithdrawalCommand:
    """An item as the ingest (or withdrawal) command a client would send, its attachments'
    `blob_parts` after its own Parts (a text item's text becomes Part `body`); raises
    msgspec.ValidationError when its content is not TextContent or ManifestContent without Blobs."""
    # Converted, not constructed: a record_key that is not a string of the allowed length is refused
    # here (msgspec.ValidationError), as the same field of a client's ingest is.
    source = msgspec.convert({"corpus_id": connector["corpus_id"], "namespace": connector["source_namespace"],
                              "record_key": item["record_key"]}, SourceIdentity)
    key = item_key(connector["connector_id"], item)
    if item.get("withdraw") is True:
        return WithdrawalCommand(idempotency_key=key + ":withdraw", source=source)
    content = msgspec.convert(item["content"], Content)
    if not isinstance(content, (TextContent, ManifestContent)) or (
            isinstance(content, ManifestContent) and any(not isinstance(p.content, TextContent)
                                                         for p in content.parts)):
        raise msgspec.ValidationError("connector items carry text, never Blobs")
    if blob_parts:
        own = content.parts if isinstance(content, ManifestContent) else [Part(key="body", role="body", content=content)]
        content = ManifestContent(parts=[*own, *blob_parts])
    extensions = item.get("extensions")
    return IngestCommand(
        idempotency_key=key, source=source, content=content,
        provenance=Provenance(origin="connector", producer=producer, producer_version=producer_version,
                              connector=connector["connector_id"]),
        extensions=msgspec.convert(extensions, dict[str, Extension]) if extensions else None)


# ---------------------------------------------------------------- the built-in fixture kind


def fixture_fetch(config: dict[str, Any], checkpoint: Any) -> dict[str, Any]:
    """The `fixture` kind's page from checkpoint `{offset}`, shaped as a plugin's fetch answer;
    a configured `error` fails every run with it (decisions-part2 "Built-in `fixture` kind")."""
    error = config.get("error")
    if error:
        raise RunFailure(error["code"], "the fixture configuration asks for this failure", error["error_class"])
    offset = checkpoint.get("offset", 0) if isinstance(checkpoint, dict) else 0
    size = config.get("page_size", 100)
    items = config["items"][offset:offset + size]
    end = offset + len(items)
    return {"items": [fixture_item(item, offset + n) for n, item in enumerate(items)],
            "checkpoint": {"offset": end}, "more": end < len(config["items"]), "reads": 1 if items else 0}


def is_fixture_item(item: Any) -> bool:
    """Whether fixture_item can read `item`: a pulled item always can (the kind's config schema
    requires these members); a pushed one is any JSON, so it is asked first."""
    if not isinstance(item, dict):
        return False
    needed = {"record_key", "revision"} if item.get("withdraw") else {"record_key", "revision", "text"}
    return needed <= item.keys()


def fixture_item(item: dict[str, Any], position: int) -> dict[str, Any]:
    if item.get("withdraw"):
        return {"record_key": item["record_key"], "revision": item["revision"], "withdraw": True,
                "source_position": str(position)}
    text = {"kind": "text", "text": item["text"]}
    content = text if "title" not in item else {"kind": "manifest", "parts": [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": item["title"]}},
        {"key": "body", "role": "body", "content": text}]}
    return {"record_key": item["record_key"], "revision": item["revision"], "source_position": str(position),
            "content": content}
