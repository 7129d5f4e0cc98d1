"""What a retrieval configuration indexes (part 1 "Retrieval configuration", FieldMapping rules)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

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


_parts = st.lists(st.fixed_dictionaries({
    "key": st.text(min_size=1, max_size=4),
    "role": st.sampled_from(["title", "body", "caption"]),
    "content": st.one_of(st.fixed_dictionaries({"kind": st.just("text"), "text": st.text(max_size=20)}),
                         st.fixed_dictionaries({"kind": st.just("blob"), "blob_id": st.just("blob_x")})),
}), max_size=5)


@given(_parts, st.sampled_from(["/manifest/title", "/manifest/text", "/manifest/parts/0/key", "/provenance/producer"]))
def test_a_field_reads_what_its_pointer_addresses_in_the_source_view(parts, pointer):
    # part 1 FieldMapping: a search field indexes the value at its pointer in the canonical
    # source view, whether or not the whole view is built for it (the default title pointer)
    payload = msgspec.structs.replace(PAYLOAD, manifest={"parts": parts})
    config = {"fields": [{"name": "title", "source_pointer": pointer, "type": "string", "roles": ["search"]},
                         {"name": "also", "source_pointer": pointer, "type": "string", "roles": ["search"]}]}
    expected = resolve(source_view(payload), pointer)
    expected = expected if isinstance(expected, str) else ""
    texts = IndexTexts(config, payload)
    assert texts.title == expected
    assert texts.extra == expected
