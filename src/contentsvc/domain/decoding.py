"""Request bodies decoded into Structs, with faults named as JSON Pointers.

Not JSON, not UTF-8, nested deeper than MAX_JSON_DEPTH, or a top level that
is not an object: 400 malformed_json. A wrong member (missing, wrong type, out
of range, unknown, a string holding U+0000): 422 invalid_schema with `field`
pointing at the first fault (decisions.md).
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any, TypeVar

import msgspec
import msgspec.inspect

from contentsvc.domain.errors import ApiError, invalid_schema

T = TypeVar("T")

_LOCATION = re.compile(r" - at `(\$[^`]*)`$")
_PATH_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(\"(?:[^\"\\]|\\.)*\")\]")
_NAMED_MEMBER = re.compile(r"(?:missing required field|unknown field) `([^`]*)`")

# Deeper JSON is refused before it is parsed: every later step (canonical form,
# storage, the journal) may then walk a request without running out of stack.
MAX_JSON_DEPTH = 64
# Bodies shorter than this first count their brackets (a few microseconds, and no numpy).
_COUNT_BRACKETS_BELOW = 16384
_NUL_ESCAPE = b"\\u0000"


def pointer_token(token: str) -> str:
    """One reference token of a JSON Pointer (RFC 6901)."""
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
    return "".join("/" + pointer_token(t) for t in tokens), exact


def pointer_of(error: msgspec.ValidationError) -> tuple[str, str]:
    """Human message without the location suffix, and the JSON Pointer of the fault."""
    text = str(error)
    match = _LOCATION.search(text)
    message = text[: match.start()] if match else text
    pointer, exact = msgspec_path_to_pointer(match.group(1)) if match else ("", True)
    named = _NAMED_MEMBER.search(message)
    if named and exact:  # the fault is the member itself, not the object holding it
        pointer += "/" + pointer_token(named.group(1))
    return message, pointer


def malformed(message: str = "The body is not a JSON object.") -> ApiError:
    return ApiError(400, "malformed_json", message)


def _backslashes_before(raw: bytes, at: int) -> int:
    """How many backslashes run up to `at`."""
    start = at
    while start and raw[start - 1] == 0x5C:
        start -= 1
    return at - start


def too_deep(raw: bytes) -> bool:
    """Whether raw JSON nests arrays and objects deeper than MAX_JSON_DEPTH (brackets inside
    strings do not count). Linear and vectorized: only the brackets and quotes are looked at
    one by one, a few thousand in a batch of 100 abstracts (0.2 ms where blanking its strings
    with a pattern first took 1.7 ms, a sixth of the API's time for a batch)."""
    if len(raw) < _COUNT_BRACKETS_BELOW and raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False  # not enough brackets to nest that deep
    import numpy as np  # here: the workers that decode only shallow items never load it

    data = np.frombuffer(raw, dtype=np.uint8)
    folded = data | 0x20  # "[" and "{" differ in one bit, as do "]" and "}"
    marks = np.flatnonzero((folded == 0x7B) | (folded == 0x7D) | (data == 0x22))  # in body order
    kinds = data[marks]
    quotes = kinds == 0x22
    delimiters = quotes.copy()
    # A quote after an odd run of backslashes is escaped, inside a string (in JSON a backslash
    # is only ever inside one); one after an even run ends its string. Both are rare.
    quote_marks = np.flatnonzero(quotes)
    for i in quote_marks[data[marks[quote_marks] - 1] == 0x5C].tolist():
        at = int(marks[i])
        if at and _backslashes_before(raw, at) % 2:
            delimiters[i] = False
    # A bracket after an odd number of the quotes that open and close strings is inside one.
    inside = (np.cumsum(delimiters, dtype=np.int32) & 1) == 1
    steps = np.where((kinds | 0x20) == 0x7B, 1, -1)
    steps[quotes | inside] = 0
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0)) > MAX_JSON_DEPTH


@cache
def _deferred_members(type_: type) -> frozenset[str]:
    """Top-level members kept as raw JSON, each decoded (and checked) on its own later
    (a batch's entries: part 1 rule 2 answers their faults one by one)."""
    fields = getattr(msgspec.inspect.type_info(type_), "fields", ())
    return frozenset(f.encode_name for f in fields if _holds_raw(f.type))


def _holds_raw(kind: msgspec.inspect.Type) -> bool:
    if isinstance(kind, msgspec.inspect.RawType):
        return True
    return isinstance(kind, (msgspec.inspect.ListType, msgspec.inspect.UnionType)) and any(
        _holds_raw(t) for t in ([kind.item_type] if isinstance(kind, msgspec.inspect.ListType) else kind.types))


def nul_pointer(value: Any, skip: frozenset[str] = frozenset()) -> str | None:
    """The JSON Pointer of the first string (member name or value) holding U+0000, if any,
    outside the top-level members in `skip`. PostgreSQL cannot store that character in
    text, so no request may carry it."""
    if isinstance(value, dict) and skip:
        value = {k: v for k, v in value.items() if k not in skip}
    if _NUL_ESCAPE not in msgspec.json.encode(value):  # a walk is four times the encoding's cost
        return None
    stack = [(value, "")]
    while stack:
        node, at = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return at
        elif isinstance(node, dict):
            for key, child in reversed(list(node.items())):
                child_at = f"{at}/{pointer_token(key)}"
                if "\x00" in key:
                    return child_at
                stack.append((child, child_at))
        elif isinstance(node, list):
            stack.extend((child, f"{at}/{i}") for i, child in reversed(list(enumerate(node))))
    return None


def _json(raw: bytes, type_: Any = Any) -> Any:
    """msgspec's decode with its faults as 400 malformed_json (a schema fault passes through)."""
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        raise malformed("The body is not valid JSON.") from None
    except UnicodeDecodeError:  # msgspec checks UTF-8 as it parses
        raise malformed("The body is not valid UTF-8.") from None


JSON_WHITESPACE = b" \t\n\r"  # RFC 8259's four; bytes.strip() would strip a vertical tab too


def decode_body(raw: bytes, type_: type[T], *, depth_checked: bool = False) -> T:
    """Decode raw JSON bytes into type_, raising the contract's errors. `depth_checked`:
    the bytes are part of a body whose nesting was already bounded (a batch entry)."""
    if not depth_checked and too_deep(raw):
        raise malformed(f"The body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.")
    if _NUL_ESCAPE in raw:
        at = nul_pointer(_json(raw), _deferred_members(type_))
        if at is not None:
            raise invalid_schema("Strings may not contain U+0000.", at)
    if not raw.lstrip(JSON_WHITESPACE)[:1] == b"{":
        _json(raw)  # not JSON at all says so first
        raise malformed()  # JSON, but its top level is not an object
    try:
        return _json(raw, type_)
    except msgspec.ValidationError as exc:
        # msgspec validates while it parses: a schema fault seen before a syntax
        # error further on must not hide that the body is not JSON (400 first).
        _json(raw)
        message, pointer = pointer_of(exc)
        raise invalid_schema(message, pointer) from None
