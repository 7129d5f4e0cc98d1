"""Attachments of fetched items (part 2 plugin protocol `describe_attachment`, `upload_attachment`;
decisions-part2 kind `attachments {max_bytes}`).

Each attachment of an item is described by the plugin (its size and SHA-256, or a `skip`), then
uploaded by the plugin to a presigned grant: the put_url of a part 1 Upload the core creates for
the Connector's Organization. The Upload is verified as any Upload is, and the item carries the
Blob as a Part (the attachment's key, role, parent_key, media type and extensions), so its Version
is normalized like a client's upload.

An Upload's idempotency key names the Connector, the item, the attachment and its digest: a page
repeated after a crash finds its Uploads verified and nothing is uploaded twice. Bytes that are not
the described ones are the source error `attachment_changed`: the attachment is described and
uploaded once more, and a second mismatch fails the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from contentsvc.commands.uploads import confirm_upload, create_upload
from contentsvc.connectors.pages import RunFailure
from contentsvc.domain import uploads as up
from contentsvc.domain.clock import iso
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import BlobContent, Extension, Part, UploadRequest
from contentsvc.readmodel.uploads import load_upload

SHA256 = re.compile(r"^[0-9a-f]{64}$")
UPLOAD_SESSIONS = 3  # Uploads tried per described attachment before its run fails

Invoke = Callable[[str, dict[str, Any]], Awaitable[Any]]  # a plugin call: route, body -> answer
Database = Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]  # runs a step on the worker's connection


@dataclass(frozen=True)
class Grants:
    """What a presigned grant needs: the API's base URL as the plugin reaches it, the URL key and
    how long a grant lasts."""

    base_url: str
    secret: bytes
    ttl_seconds: int


async def blob_parts(invoke: Invoke, db: Database, common: dict[str, Any], principal, connector_id: str,
                     item: dict[str, Any], max_bytes: int, grants: Grants) -> tuple[list[Part], dict[str, Any]]:
    """The item's attachments as Blob Parts, and the item extensions the plugin added."""
    parts: list[Part] = []
    extensions: dict[str, Any] = {}
    for attachment in item.get("attachments") or []:
        for attempt in range(2):  # a second description after `attachment_changed`
            described = await invoke("connector/describe_attachment", {
                **common, "item": {"record_key": item["record_key"], "revision": item["revision"],
                                   "extensions": item.get("extensions") or {}},
                "attachment": attachment})
            size, sha256, skip = _description(described, max_bytes)
            if isinstance(described.get("item_extensions"), dict):
                extensions.update(described["item_extensions"])
            if skip is not None:
                break
            blob_id = await _uploaded(invoke, db, common, principal, connector_id, item, attachment, size, sha256,
                                      grants)
            if blob_id is not None:
                parts.append(Part(key=attachment["key"], role=attachment["role"],
                                  content=BlobContent(blob_id=blob_id, media_type=attachment["media_type"]),
                                  parent_key=attachment.get("parent_key"),
                                  extensions={k: Extension(**v) for k, v in attachment["extensions"].items()}
                                  if attachment.get("extensions") else None))
                break
            if attempt == 1:
                raise RunFailure("attachment_changed", f"the bytes of attachment {attachment['key']!r} of item "
                                 f"{item['record_key']!r} changed after they were described, twice", "source")
    return parts, extensions


def _description(described: Any, max_bytes: int) -> tuple[int, str, str | None]:
    if not isinstance(described, dict):
        raise RunFailure("invalid_plugin_output", "the describe_attachment answer is not a JSON object")
    skip = described.get("skip")
    if skip is not None:
        if not isinstance(skip, str) or not 1 <= len(skip) <= 64:
            raise RunFailure("invalid_plugin_output", "skip must be a string of at most 64 characters")
        return 0, "", skip
    size, sha256 = described.get("size_bytes"), described.get("sha256")
    if not isinstance(size, int) or not 1 <= size <= max_bytes:
        raise RunFailure("invalid_plugin_output", f"size_bytes must be between 1 and the kind's {max_bytes}")
    if not isinstance(sha256, str) or not SHA256.match(sha256):
        raise RunFailure("invalid_plugin_output", "sha256 must be 64 lowercase hex digits")
    return size, sha256, None


async def _uploaded(invoke: Invoke, db: Database, common: dict[str, Any], principal, connector_id: str,
                    item: dict[str, Any], attachment: dict[str, Any], size: int, sha256: str,
                    grants: Grants) -> str | None:
    """The verified Blob of the described bytes (None: the bytes that came were other ones)."""
    key = f"con:{connector_id}:{item['record_key']}:{item['revision']}:{attachment['key']}:{sha256}"
    row = None
    for session in range(UPLOAD_SESSIONS):  # past a failed (or expired) session, the next one
        request = UploadRequest(idempotency_key=key if session == 0 else f"{key}:{session}",
                                media_type=attachment["media_type"], size_bytes=size, sha256=sha256)

        async def open_upload(conn):
            upload_id, _ = await create_upload(conn, principal, request, grants.ttl_seconds)
            await confirm_upload(conn, principal, upload_id, None)  # an expired, unused session fails here
            return await load_upload(conn, upload_id, principal.org_id)

        try:
            row = await db(open_upload)
        except ApiError as exc:
            raise RunFailure("attachment_refused", f"attachment {attachment['key']!r}: {exc.code}: {exc.message}",
                             "source") from None
        if row["state"] != "failed":
            break
    if row["state"] == "failed":
        raise RunFailure("attachment_changed", f"the uploads of attachment {attachment['key']!r} of item "
                         f"{item['record_key']!r} failed {UPLOAD_SESSIONS} times", "source")
    if row["state"] == "awaiting_upload":
        grant = {"put_url": up.put_url(grants.base_url, grants.secret, row["upload_id"], row["expires_at"]),
                 "put_headers": up.put_headers(row["media_type"], row["size_bytes"], row["sha256"]),
                 "expires_at": iso(row["expires_at"])}
        answer = await invoke("connector/upload_attachment", {
            **common, "item": {"record_key": item["record_key"], "revision": item["revision"]},
            "attachment": {**attachment, "size_bytes": size, "sha256": sha256}, "grant": grant})
        if not isinstance(answer, dict) or answer.get("status") != "uploaded":
            raise RunFailure("invalid_plugin_output", "the upload_attachment answer is not {status: uploaded}")

    async def confirm(conn):
        await confirm_upload(conn, principal, row["upload_id"], None)
        return await load_upload(conn, row["upload_id"], principal.org_id)

    confirmed = await db(confirm)
    return confirmed["blob_id"] if confirmed["state"] == "verified" else None
