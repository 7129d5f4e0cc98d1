"""What each key of `Settings` is, read from its type: which keys are secrets or
paths, and how to say in words what a key accepts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import msgspec.inspect as mi

from contentsvc.config.settings import SECRET, Settings

KeyPath = tuple[str, ...]
# In a key path, the step standing for every key of a table of sections ([plugins.<plugin_id>]).
ANY_KEY = "*"


@cache
def settings_type() -> mi.StructType:
    return mi.type_info(Settings)


def unwrap(t: mi.Type) -> tuple[mi.Type, bool]:
    """The type without `| None` and `Annotated` metadata, and whether it is a secret."""
    secret = False
    while True:
        if isinstance(t, mi.Metadata):
            secret = secret or bool((t.extra or {}).get(SECRET))
            t = t.type
        elif isinstance(t, mi.UnionType):
            others = [u for u in t.types if not isinstance(u, mi.NoneType)]
            if len(others) != 1:
                return t, secret
            t = others[0]
        else:
            return t, secret


def entry_type(t: mi.Type) -> mi.StructType | None:
    """The section type of a table of sections keyed by id (`plugins`, `destinations`), else None."""
    core, _ = unwrap(t)
    if isinstance(core, mi.DictType):
        value, _ = unwrap(core.value_type)
        if isinstance(value, mi.StructType):
            return value
    return None


def leaf_keys(t: mi.Type | None = None, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, mi.Type]]:
    """Every key that holds a value (not a section), with its type; a table of sections keyed by id
    contributes its entries' keys with ANY_KEY in the id's place."""
    for f in (t or settings_type()).fields:
        core, _ = unwrap(f.type)
        if isinstance(core, mi.StructType):
            yield from leaf_keys(core, (*prefix, f.name))
        elif (entry := entry_type(f.type)) is not None:
            yield from leaf_keys(entry, (*prefix, f.name, ANY_KEY))
        else:
            yield (*prefix, f.name), f.type


def concrete_keys(data: dict, key: KeyPath) -> Iterator[KeyPath]:
    """The key paths of `data` that `key` (which may hold ANY_KEY steps) names."""
    if not key:
        yield ()
        return
    head, rest = key[0], key[1:]
    if not rest:
        yield (head,)
        return
    names = list(data) if head == ANY_KEY else [head]
    for name in names:
        inner = data.get(name)
        if isinstance(inner, dict):
            yield from ((name, *tail) for tail in concrete_keys(inner, rest))


def is_path(t: mi.Type) -> bool:
    core, _ = unwrap(t)
    return isinstance(core, mi.CustomType) and issubclass(core.cls, Path)


def is_table(t: mi.Type) -> bool:
    return isinstance(unwrap(t)[0], mi.DictType)


def is_secret(t: mi.Type) -> bool:
    """A secret key, or a table whose values are secrets."""
    core, secret = unwrap(t)
    if isinstance(core, mi.DictType):
        return unwrap(core.value_type)[1]
    return secret


def type_at(steps: list[str]) -> mi.Type | None:
    """The type at a msgspec location: field names, `[n]` for an array item, `[...]` for a table value."""
    t: mi.Type = settings_type()
    for step in steps:
        core, _ = unwrap(t)
        if step.startswith("[") or (isinstance(core, mi.DictType) and entry_type(core) is not None):
            if isinstance(core, mi.ListType):
                t = core.item_type
            elif isinstance(core, mi.DictType):
                t = core.value_type
            else:
                return None
        elif isinstance(core, mi.StructType):
            match = next((f for f in core.fields if f.name == step), None)
            if match is None:
                return None
            t = match.type
        else:
            return None
    return t


def is_section(steps: list[str]) -> bool:
    t = type_at(steps)
    return t is not None and (isinstance(unwrap(t)[0], mi.StructType) or entry_type(t) is not None)


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    low = t.ge if t.ge is not None else t.gt
    high = t.le if t.le is not None else t.lt
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" of at least {low}" if t.ge is not None else f" greater than {low}"
    if high is not None:
        return f" of at most {high}" if t.le is not None else f" less than {high}"
    return ""


def describe(t: mi.Type) -> str:
    """What a key accepts, in words: 'an integer from 1 to 86400'."""
    core, _ = unwrap(t)
    if isinstance(core, mi.BoolType):
        return "true or false"
    if isinstance(core, mi.IntType):
        return "an integer" + _bounds(core)
    if isinstance(core, mi.FloatType):
        return "a number" + _bounds(core)
    if isinstance(core, mi.StrType):
        return "a string" + (f" matching {core.pattern}" if core.pattern else "")
    if isinstance(core, mi.LiteralType):
        return "one of " + ", ".join(json.dumps(v) for v in core.values)
    if isinstance(core, mi.ListType):
        size = []
        if core.min_length:
            size.append(f"at least {core.min_length}")
        if core.max_length is not None:
            size.append(f"at most {core.max_length}")
        return "an array" + (f" of {' and '.join(size)} items" if size else "")
    if isinstance(core, (mi.DictType, mi.StructType)):
        return "a table"
    if is_path(core):
        return "a path (a string)"
    return "a value of another type"
