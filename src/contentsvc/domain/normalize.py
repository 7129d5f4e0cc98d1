"""The built-in text path: a command's content becomes a normalized manifest.

Text is NFC-normalized. TextContent becomes one Part `body` (after a
`title` Part when a title is given), as decisions.md says.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

import msgspec


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _normalize_part(part: dict[str, Any]) -> dict[str, Any]:
    content = dict(part["content"])
    if content.get("kind") == "text":
        content["text"] = nfc(content["text"])
    out = {"key": part["key"], "role": part["role"], "content": content}
    if part.get("parent_key") is not None:
        out["parent_key"] = part["parent_key"]
    if part.get("extensions"):
        out["extensions"] = part["extensions"]
    return out


def build_manifest(content: dict[str, Any], title: str | None) -> dict[str, Any]:
    """content and title as accepted (plain dicts); returns {"parts": [...]}."""
    parts: list[dict[str, Any]] = []
    if title is not None:
        parts.append({"key": "title", "role": "title", "content": {"kind": "text", "text": nfc(title)}})
    kind = content["kind"]
    if kind == "text":
        parts.append({"key": "body", "role": "body", "content": {"kind": "text", "text": nfc(content["text"])}})
    elif kind == "manifest":
        parts.extend(_normalize_part(p) for p in content["parts"])
    else:  # blob: read by its route (uploads); the manifest references it
        parts.append({"key": "body", "role": "body", "content": dict(content)})
    return {"parts": parts}


def manifest_digest(manifest: dict[str, Any]) -> bytes:
    """Equal digests mean equal normalized content (the duplicate rule)."""
    return hashlib.sha256(msgspec.json.encode(manifest, order="sorted")).digest()
