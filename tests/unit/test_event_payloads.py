"""Event payloads through the journal boundary (journal/codec.py).

Every payload Struct comes back as itself; payloads written before they
were Structs (plain JSON objects, without a `kind` member) still decode;
a kind outside the catalogue stays raw.
"""

from __future__ import annotations

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contentsvc.journal import events as ev
from contentsvc.journal.codec import decode_payload, encode_payload

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def values(t: mi.Type) -> st.SearchStrategy:
    """Any value of a msgspec type, as the journal may hold it."""
    simple = {
        mi.StrType: st.text(max_size=12),
        mi.IntType: st.integers(-(2**63), 2**63 - 1),
        mi.FloatType: st.floats(allow_nan=False, allow_infinity=False),
        mi.BoolType: st.booleans(),
        mi.NoneType: st.none(),
        mi.AnyType: JSON,
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.UnionType):
        return st.one_of([values(member) for member in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(values(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(values(t.key_type), values(t.value_type), max_size=3)
    if isinstance(t, mi.StructType):  # a member with a default may be left out (absent, or its default)
        return st.fixed_dictionaries({f.name: values(f.type) for f in t.fields if f.required},
                                     optional={f.name: values(f.type) for f in t.fields if not f.required},
                                     ).map(lambda members: t.cls(**members))
    raise TypeError(f"no strategy for {t!r}")


@pytest.mark.parametrize("kind", sorted(ev.PAYLOAD_TYPES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_payload_round_trips_through_the_journal_boundary(kind, data):
    payload = data.draw(values(mi.type_info(ev.PAYLOAD_TYPES[kind])))
    assert ev.kind_of(payload) == kind
    assert decode_payload(kind, encode_payload(payload)) == payload


def test_payloads_written_as_plain_json_objects_still_decode():
    accepted = decode_payload(ev.RECORD_ACCEPTED, b"""{
        "record_id": "rec_1", "version_id": "ver_1", "receipt_id": "rcp_1",
        "source": {"corpus_id": "c", "namespace": "n", "record_key": "k"},
        "manifest": {"parts": [{"key": "body", "role": "body", "content": {"kind": "text", "text": "hi"}}]},
        "provenance": {"origin": "client", "accepted_at": "2025-01-01T00:00:00Z"}, "extensions": null,
        "relations": [], "accepted_at": "2025-01-01T00:00:00Z", "created_at": "2025-01-01T00:00:01+00:00",
        "previous_version_id": null, "diagnostics": [], "quarantined": false}""")
    assert isinstance(accepted, ev.RecordAccepted)
    assert (accepted.record_id, accepted.source.record_key, accepted.quarantined) == ("rec_1", "k", False)
    assert accepted.manifest["parts"][0]["content"]["text"] == "hi"

    currentness_only = decode_payload(ev.RECORD_AVAILABILITY_CHANGED,
                                      b'{"record_id": "rec_1", "version_id": "ver_0", "is_current": false}')
    assert currentness_only.state is msgspec.UNSET and currentness_only.searchable is msgspec.UNSET

    ingest = decode_payload(ev.INGEST_ACCEPTED, b"""{
        "receipt_id": "rcp_1", "source": {"corpus_id": "c", "namespace": "n", "record_key": "k"},
        "content": {"kind": "blob", "blob_id": "blob_1", "media_type": "text/plain"}, "title": null,
        "provenance": {"origin": "client"}, "extensions": null, "relations": [],
        "accepted_at": "2025-01-01T00:00:00Z",
        "blobs": {"blob_1": {"sha256": "ab", "size_bytes": 2, "storage_key": "s/ab"}}}""")
    assert ingest.blobs["blob_1"] == ev.VerifiedBlob(sha256="ab", size_bytes=2, storage_key="s/ab")

    progress = decode_payload(ev.OPERATION_CHANGED, b"""{"operation": {"operation_id": "op_1", "state": "running",
        "counters": {"versions_in_scope": 4, "versions_done": 1}, "progress": 0.25}}""")
    assert progress.request is msgspec.UNSET
    assert msgspec.to_builtins(progress.operation) == {
        "operation_id": "op_1", "state": "running", "counters": {"versions_in_scope": 4, "versions_done": 1},
        "progress": 0.25}


def test_a_payload_decodes_the_same_with_or_without_its_kind_member():
    payload = ev.RecordEnriched(record_id="rec_1", version_id="ver_1", space="minilm")
    without_kind = msgspec.json.encode({k: v for k, v in msgspec.to_builtins(payload).items() if k != "kind"})
    assert decode_payload(ev.RECORD_ENRICHED, without_kind) == payload == \
        decode_payload(ev.RECORD_ENRICHED, encode_payload(payload))


def test_a_kind_outside_the_catalogue_stays_raw():
    raw = decode_payload("later.kind", b'{"anything": [1, 2]}')
    assert isinstance(raw, msgspec.Raw) and bytes(raw) == b'{"anything": [1, 2]}'
