"""Retrieval configuration: the default, validation, and the effective form.

Explicit fields override default fields by logical name (part 1, Retrieval
configuration). The canonical source view of a Version exposes
`/manifest/title` (the text of the Part with role `title`) and
`/manifest/text` (all text Parts) besides the manifest's own members.
"""

from __future__ import annotations

import re

from contentsvc.domain.models import RetrievalConfig
from contentsvc.domain.errors import ApiError
from contentsvc.domain.extensions import DECLARED_NAMESPACES
from contentsvc.journal.events import RecordAccepted

INSTALLED_PROFILES = ("default", "example.editorial")

DEFAULT_FIELDS = [
    {"name": "title", "source_pointer": "/manifest/title", "type": "string", "roles": ["search"]},
    {"name": "body", "source_pointer": "/manifest/text", "type": "string", "roles": ["search"]},
]
DEFAULT_RETRIEVAL = {"plugin_profile": "default", "fields": DEFAULT_FIELDS}


# The roots a field may read from: the manifest, the provenance or a declared namespace's
# extension. One expression for the check below and the served document's `pattern` (ECMA-262
# and Python read it alike: `[\s\S]` is any character, newlines included, in both).
_ROOTS = rf"/(manifest|provenance|extensions/({'|'.join(map(re.escape, DECLARED_NAMESPACES))}))(/[\s\S]*)?"
SOURCE_POINTER_PATTERN = f"^{_ROOTS}$"


def _pointer_root_ok(pointer: str) -> bool:
    return re.fullmatch(_ROOTS, pointer) is not None


def effective_retrieval(config: RetrievalConfig | None, field_prefix: str = "/retrieval") -> dict:
    """Validate a requested configuration and resolve it against the defaults."""
    if config is None:
        return DEFAULT_RETRIEVAL
    if config.plugin_profile not in INSTALLED_PROFILES:
        raise ApiError(
            422,
            "unsupported_profile",
            f"Profile {config.plugin_profile!r} is not installed; installed: {', '.join(INSTALLED_PROFILES)}.",
            field=f"{field_prefix}/plugin_profile",
        )
    seen: set[str] = set()
    explicit: dict[str, dict] = {}
    for i, f in enumerate(config.fields):
        where = f"{field_prefix}/fields/{i}"
        if f.name in seen:
            raise ApiError(422, "invalid_mapping", f"Field {f.name!r} is mapped twice.", field=f"{where}/name")
        seen.add(f.name)
        if not _pointer_root_ok(f.source_pointer):
            raise ApiError(
                422,
                "invalid_mapping",
                "source_pointer must be rooted at /manifest, /provenance or /extensions/{declared namespace}.",
                field=f"{where}/source_pointer",
            )
        if "search" in f.roles and f.type not in ("string", "string_array"):
            raise ApiError(
                422, "invalid_mapping", "A search field must be of type string or string_array.", field=f"{where}/type"
            )
        explicit[f.name] = {
            "name": f.name,
            "source_pointer": f.source_pointer,
            "type": f.type,
            "roles": sorted(set(f.roles), key=f.roles.index),
        }
    fields = [explicit.pop(d["name"], d) for d in DEFAULT_FIELDS] + list(explicit.values())
    return {"plugin_profile": config.plugin_profile, "fields": fields}


# ------------------------------------------------------- what a configuration indexes

TEXT_POINTER = "/manifest/text"  # all text Parts: indexed Part by Part, so hits cite a Part
TITLE_POINTER = "/manifest/title"


def _title(manifest: dict) -> str:
    """The text of the Parts with role `title`."""
    return " ".join(p["content"]["text"] for p in manifest["parts"]
                    if p["role"] == "title" and p["content"].get("kind") == "text")


def source_view(version: RecordAccepted) -> dict:
    """The canonical source view of a Version (its record.accepted payload) that pointers address."""
    manifest = version.manifest
    return {
        "manifest": {
            **manifest,
            "title": _title(manifest),
            "text": "\n".join(p["content"]["text"] for p in manifest["parts"] if p["content"].get("kind") == "text"),
        },
        "provenance": version.provenance or {},
        "extensions": version.extensions or {},
    }


def resolve(view: dict, pointer: str):
    """RFC 6901: the value at `pointer`, or None when it leads nowhere."""
    node = view
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node


def _as_text(value, field_type: str) -> str:
    if field_type == "string" and isinstance(value, str):
        return value
    if field_type == "string_array" and isinstance(value, list):
        return " ".join(v for v in value if isinstance(v, str))
    return ""


class IndexTexts:
    """A Version's searchable text under one configuration: the title (the `title`
    search field replaces the projected title), whether the Parts' text is searched
    (the `body` field on its default pointer), and the other search fields' text,
    indexed once per Version."""

    def __init__(self, retrieval: dict, version: RecordAccepted) -> None:
        # The whole source view (every Part's text joined, the manifest copied) is built only for
        # a pointer other than the default two, which need none of it: indexing read its title
        # alone (2-3 us a SciFact Version, and a copy of all of a long Version's text).
        view = None
        self.title = ""
        self.parts_searched = False
        extra: list[str] = []
        for f in retrieval["fields"]:
            if "search" not in f["roles"]:
                continue
            pointer = f["source_pointer"]
            if f["name"] == "body" and pointer == TEXT_POINTER:
                self.parts_searched = True
                continue
            if pointer == TITLE_POINTER:
                value = _title(version.manifest)
            else:
                view = view or source_view(version)
                value = resolve(view, pointer)
            if f["name"] == "title":
                self.title = _as_text(value, f["type"])
            else:
                extra.append(_as_text(value, f["type"]))
        self.extra = " ".join(t for t in extra if t)
