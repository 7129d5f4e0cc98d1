"""The tools of the contract's tables: names, argument schemas, annotations.

Arguments are validated here, before any HTTP call, with the same bounds
the JSON Schemas state; the server decides everything else.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from contentsvc.domain.decoding import pointer_of

NonEmpty = Annotated[str, Meta(min_length=1)]


class Args(Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ListCorporaArgs(Args, kw_only=True):
    page_cursor: NonEmpty | None = None


class SearchFilterArgs(Args, kw_only=True):
    source_namespaces: Annotated[list[Annotated[str, Meta(min_length=1, max_length=200)]],
                                 Meta(min_length=1, max_length=50)]


class SearchArgs(Args, kw_only=True):
    query: Annotated[str, Meta(min_length=1, max_length=8192)]
    corpus_ids: Annotated[list[NonEmpty], Meta(min_length=1, max_length=16)]
    mode: Literal["lexical", "semantic", "hybrid"] | None = None
    profile: Annotated[str, Meta(pattern=r"^[a-z][a-z0-9_]{0,31}$")] | None = None
    limit: Annotated[int, Meta(ge=1, le=50)] | None = None
    filter: SearchFilterArgs | None = None


class ReadRecordArgs(Args, kw_only=True):
    record_id: NonEmpty
    version_id: NonEmpty | None = None


class IngestTextArgs(Args, kw_only=True):
    corpus_id: NonEmpty
    record_key: NonEmpty
    text: NonEmpty
    namespace: NonEmpty = "mcp"
    idempotency_key: NonEmpty | None = None


class ReadReceiptArgs(Args, kw_only=True):
    receipt_id: NonEmpty


def _schema(struct: type) -> dict:
    """JSON Schema of an argument Struct, inlined (no $defs), additionalProperties false."""
    _, components = msgspec.json.schema_components([struct], ref_template="#/$defs/{name}")

    def inline(node):
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(components[node["$ref"].rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items() if k != "title"}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    schema = inline(components[struct.__name__])
    schema["additionalProperties"] = False
    return schema


def _unique(schema: dict, *names: str) -> dict:
    for name in names:
        node = schema["properties"]
        for part in name.split("."):
            node = node[part]
        target = next((alt for alt in node.get("anyOf", [node]) if alt.get("type") == "array"), node)
        target["uniqueItems"] = True
    return schema


def _search_schema() -> dict:
    schema = _unique(_schema(SearchArgs), "corpus_ids")
    props = schema["properties"]
    props["mode"] = {"type": "string", "enum": ["lexical", "semantic", "hybrid"], "default": "hybrid",
                     "description": "server default hybrid"}
    props["profile"] = {"type": "string", "pattern": r"^[a-z][a-z0-9_]{0,31}$", "default": "default"}
    props["limit"] = {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
    props["filter"] = {
        "type": "object", "additionalProperties": False, "minProperties": 1, "required": ["source_namespaces"],
        "properties": {"source_namespaces": {"type": "array", "minItems": 1, "maxItems": 50, "uniqueItems": True,
                                             "items": {"type": "string", "minLength": 1, "maxLength": 200}}},
    }
    return schema


def _strip_nulls(schema: dict) -> dict:
    """Optional arguments are omitted, not null: drop the null alternative msgspec adds."""
    for name, prop in schema.get("properties", {}).items():
        alts = prop.get("anyOf")
        if alts:
            rest = [a for a in alts if a.get("type") != "null"]
            if len(rest) == 1:
                default = prop.get("default")
                schema["properties"][name] = dict(rest[0])
                if default is not None:
                    schema["properties"][name]["default"] = default
    return schema


TOOLS = {
    "list_corpora": dict(
        description="List the Corpora this key may read (corpus_id, name, effective_retrieval).",
        args=ListCorporaArgs, read_only=True, idempotent=True, profiles=("read", "ingest")),
    "search": dict(
        description="Search one or more Corpora; hits cite record_id, version_id, part_key and an excerpt "
                    "whose start/end are Unicode code point offsets into that Part's text.",
        args=SearchArgs, read_only=True, idempotent=False, profiles=("read", "ingest"), schema=_search_schema),
    "read_record": dict(
        description="Read a Record and one of its Versions (the current one when version_id is omitted).",
        args=ReadRecordArgs, read_only=True, idempotent=False, profiles=("read", "ingest")),
    "ingest_text": dict(
        description="Ingest text under a record_key (a new text corrects the Record with a new Version). "
                    "Text is searchable once availability.searchable is true: follow read_receipt.",
        args=IngestTextArgs, read_only=False, idempotent=True, profiles=("ingest",)),
    "read_receipt": dict(
        description="Read an Ingestion Receipt: outcome, record_id, version_id, availability, processing.",
        args=ReadReceiptArgs, read_only=True, idempotent=False, profiles=("ingest",)),
}


def input_schema(name: str) -> dict:
    spec = TOOLS[name]
    return spec["schema"]() if "schema" in spec else _strip_nulls(_schema(spec["args"]))


def tools_for(profile: str) -> list[str]:
    return [name for name, spec in TOOLS.items() if profile in spec["profiles"]]


class InvalidArguments(Exception):
    """Arguments the tool's schema refuses; `field` is the JSON Pointer of the first fault."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message, self.field = message, field


def parse(name: str, arguments: dict | None):
    try:
        args = msgspec.convert(arguments or {}, TOOLS[name]["args"])
    except msgspec.ValidationError as exc:
        message, field = pointer_of(exc)
        raise InvalidArguments(message, field) from None
    if isinstance(args, SearchArgs):
        if len(set(args.corpus_ids)) != len(args.corpus_ids):
            raise InvalidArguments("corpus_ids must be unique", "/corpus_ids")
        if args.filter and len(set(args.filter.source_namespaces)) != len(args.filter.source_namespaces):
            raise InvalidArguments("source_namespaces must be unique", "/filter/source_namespaces")
    return args
