"""The built-in text path: a command's content becomes a normalized manifest.

Text is NFC-normalized. TextContent becomes one Part `body` (after a
`title` Part when a title is given), as decisions.md says. A text/* Blob
is decoded and reduced to text here too (`blob_text`); the materializer
reads its bytes from the blob store.
"""

from __future__ import annotations

import codecs
import hashlib
import re
import unicodedata
from html.parser import HTMLParser
from typing import Any

import msgspec

from contentsvc.domain.uploads import parse_media_type


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


# ---------------------------------------------------------------- text Blobs
#
# The built-in text path also reads Blobs whose media type is text/*: the
# bytes are decoded with the media type's charset (UTF-8 by default),
# text/html is reduced to its text (script and style dropped), everything
# else (plain text, Markdown, ...) is kept as it is, then NFC-normalized.



class TextPathError(Exception):
    """The built-in text path cannot read a Blob: the Version is quarantined with this diagnostic."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def diagnostic(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": False}


def text_route_refusal(media_type: str) -> str | None:
    """None when the built-in text path can read media_type, else why it cannot."""
    base, params = parse_media_type(media_type)
    if not base.startswith("text/") or base == "text/":
        return (f"No route reads media type {base!r}: the built-in text path reads text/* only "
                "(text/plain, text/markdown, text/html, ...).")
    charset = params.get("charset")
    if charset is not None:
        try:
            codecs.lookup(charset)
        except LookupError:
            return f"The charset {charset!r} of media type {media_type!r} is not one the text path knows."
    return None


_BLOCK_TAGS = frozenset(
    "address article aside blockquote br dd div dl dt figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr "
    "li main nav ol p pre section table tbody td tfoot th thead title tr ul".split()
)
_DROPPED_TAGS = frozenset({"script", "style", "noscript", "template"})
_WHITE_SPACE = re.compile(r"\s+")


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self._dropping = 0

    def handle_starttag(self, tag, attrs):
        if tag in _DROPPED_TAGS:
            self._dropping += 1
        elif tag in _BLOCK_TAGS:
            self.pieces.append("\n")

    def handle_startendtag(self, tag, attrs):
        if tag in _BLOCK_TAGS:
            self.pieces.append("\n")

    def handle_endtag(self, tag):
        if tag in _DROPPED_TAGS:
            self._dropping = max(0, self._dropping - 1)
        elif tag in _BLOCK_TAGS:
            self.pieces.append("\n")

    def handle_data(self, data):
        if not self._dropping:
            self.pieces.append(_WHITE_SPACE.sub(" ", data))  # line breaks in HTML text are spaces


def html_to_text(html: str) -> str:
    """The text of an HTML document: blocks on their own lines, white space collapsed."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.pieces).split("\n"))
    return "\n".join(line for line in lines if line)


def blob_text(data: bytes, media_type: str) -> str:
    """The normalized text of a text/* Blob; raises TextPathError when it has none."""
    base, params = parse_media_type(media_type)
    charset = params.get("charset") or "utf-8"
    try:
        codec = codecs.lookup(charset)
    except LookupError:
        raise TextPathError("normalizer_unrouted", f"The charset {charset!r} is unknown to the text path.") from None
    try:
        text = data.decode("utf-8-sig" if codec.name == "utf-8" else codec.name)
    except UnicodeDecodeError as exc:
        raise TextPathError(
            "normalizer_failed",
            f"The Blob is not valid {charset} text: undecodable byte at offset {exc.start} "
            f"(declare its charset in the media type, e.g. 'text/plain; charset=iso-8859-1').",
        ) from None
    if "\x00" in text:  # no stored text can hold it; a UTF-16 file read as UTF-8 is full of it
        raise TextPathError(
            "normalizer_failed",
            f"The Blob's text holds U+0000 (character {text.index(chr(0))}), which no stored text can: it is "
            f"binary, or text in another encoding than {charset} (declare its charset in the media type, e.g. "
            "'text/plain; charset=utf-16').",
        )
    if base == "text/html":
        text = html_to_text(text)
    text = nfc(text)
    if not text.strip():
        raise TextPathError("normalizer_failed", "The Blob holds no text.")
    return text
