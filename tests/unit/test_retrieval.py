"""What a retrieval configuration indexes (part 1 "Retrieval configuration", FieldMapping rules)."""

from __future__ import annotations

import pytest

from contentsvc.domain.models import FieldMapping, RetrievalConfig
from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL, IndexTexts, effective_retrieval, resolve, source_view
from contentsvc.domain.errors import ApiError
from contentsvc.journal.events import RecordAccepted, Source

PAYLOAD = RecordAccepted(
    record_id="rec_x", version_id="ver_x", receipt_id="rcp_x",
    source=Source(corpus_id="c", namespace="n", record_key="k"),
    manifest={"parts": [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": "The title"}},
        {"key": "body", "role": "body", "content": {"kind": "text", "text": "The body"}},
    ]},
    provenance={"producer": "feeder"},
    extensions={"example": {"schema_version": "1", "data": {"a/b": "slash", "m~n": "tilde", "tags": ["x", "y", 3]}}},
    accepted_at="2025-01-01T00:00:00Z", created_at="2025-01-01T00:00:00Z",
)


def test_pointers_resolve_in_the_canonical_source_view():
    view = source_view(PAYLOAD)
    assert resolve(view, "/manifest/title") == "The title"
    assert resolve(view, "/manifest/text") == "The title\nThe body"
    assert resolve(view, "/manifest/parts/1/key") == "body"
    assert resolve(view, "/provenance/producer") == "feeder"
    assert resolve(view, "/extensions/example/data/a~1b") == "slash"  # RFC 6901 escapes
    assert resolve(view, "/extensions/example/data/m~0n") == "tilde"
    assert resolve(view, "/extensions/example/data/missing") is None
    assert resolve(view, "/manifest/parts/9") is None


def test_default_configuration_searches_title_and_parts():
    texts = IndexTexts(DEFAULT_RETRIEVAL, PAYLOAD)
    assert (texts.title, texts.parts_searched, texts.extra) == ("The title", True, "")


def test_explicit_fields_override_defaults_by_name_and_add_text_once():
    config = effective_retrieval(RetrievalConfig(plugin_profile="default", fields=[
        FieldMapping(name="title", source_pointer="/provenance/producer", type="string", roles=["search"]),
        FieldMapping(name="tags", source_pointer="/extensions/example/data/tags", type="string_array",
                     roles=["search", "filter"]),
        FieldMapping(name="kept", source_pointer="/provenance/producer", type="string", roles=["filter"]),
    ]))
    assert [f["name"] for f in config["fields"]] == ["title", "body", "tags", "kept"]
    texts = IndexTexts(config, PAYLOAD)
    assert texts.title == "feeder"  # a search field named title replaces the projected title
    assert texts.extra == "x y"  # only the strings of a string_array; filter-only fields add nothing
    assert texts.parts_searched


@pytest.mark.parametrize("pointer", ["/source/x", "/extensions/undeclared/data", "manifest/title", "/"])
def test_other_roots_are_invalid_mapping(pointer):
    with pytest.raises(ApiError) as e:
        effective_retrieval(RetrievalConfig(plugin_profile="default", fields=[
            FieldMapping(name="f", source_pointer=pointer, type="string", roles=["search"])]))
    assert e.value.code == "invalid_mapping" and e.value.field == "/retrieval/fields/0/source_pointer"
