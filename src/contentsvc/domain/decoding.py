"""Request bodies decoded into Structs, with faults named as JSON Pointers.

Not JSON, or a top level that is not an object: 400 malformed_json.
A wrong member (missing, wrong type, out of range, unknown): 422
invalid_schema with `field` pointing at the first fault (decisions.md).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from contentsvc.domain.errors import ApiError, invalid_schema

T = TypeVar("T")

_LOCATION = re.compile(r" - at `(\$[^`]*)`$")
_PATH_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(\"(?:[^\"\\]|\\.)*\")\]")
_NAMED_MEMBER = re.compile(r"(?:missing required field|unknown field) `([^`]*)`")


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def msgspec_path_to_pointer(path: str) -> tuple[str, bool]:
    """`$.entries[3].source` -> `/entries/3/source` (RFC 6901).

    msgspec names a map's key as `[...]`; the pointer then stops at the map
    and the second value says it is not exact.
    """
    tokens: list[str] = []
    exact = "[...]" not in path
    for match in _PATH_TOKEN.finditer(path[1:].split("[...]")[0]):
        name, index, quoted = match.groups()
        if name is not None:
            tokens.append(name)
        elif index is not None:
            tokens.append(index)
        elif quoted is not None:
            tokens.append(msgspec.json.decode(quoted.encode()))
    return "".join("/" + _escape(t) for t in tokens), exact


def pointer_of(error: msgspec.ValidationError) -> tuple[str, str]:
    """Human message without the location suffix, and the JSON Pointer of the fault."""
    text = str(error)
    match = _LOCATION.search(text)
    message = text[: match.start()] if match else text
    pointer, exact = msgspec_path_to_pointer(match.group(1)) if match else ("", True)
    named = _NAMED_MEMBER.search(message)
    if named and exact:  # the fault is the member itself, not the object holding it
        pointer += "/" + _escape(named.group(1))
    return message, pointer


def malformed(message: str = "The body is not a JSON object.") -> ApiError:
    return ApiError(400, "malformed_json", message)


def decode_body(raw: bytes, type_: type[T], *, prefix: str = "") -> T:
    """Decode raw JSON bytes into type_, raising the contract's errors."""
    if not raw.lstrip()[:1] == b"{":
        # Either not JSON at all or a top level that is not an object.
        try:
            msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise malformed("The body is not valid JSON.") from None
        raise malformed()
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        # msgspec validates while it parses: a schema fault seen before a syntax
        # error further on must not hide that the body is not JSON (400 first).
        try:
            msgspec.json.decode(raw)
        except msgspec.DecodeError:
            raise malformed("The body is not valid JSON.") from None
        message, pointer = pointer_of(exc)
        raise invalid_schema(message, prefix + pointer) from None
    except msgspec.DecodeError:
        raise malformed("The body is not valid JSON.") from None


def convert(obj: Any, type_: type[T], *, prefix: str = "") -> T:
    """Validate an already parsed value (used for batch entries)."""
    try:
        return msgspec.convert(obj, type=type_)
    except msgspec.ValidationError as exc:
        message, pointer = pointer_of(exc)
        raise invalid_schema(message, prefix + pointer) from None
