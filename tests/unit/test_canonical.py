"""Idempotency canonicalisation (part 1 Conventions: same key and same canonical request)."""

import json

import msgspec
from hypothesis import given, strategies as st

from contentsvc.domain.canonical import request_digest
from contentsvc.domain.decoding import decode_body
from contentsvc.domain.models import IngestCommand

# Any text a request may hold: decoding refuses U+0000 (PostgreSQL cannot store it).
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=40)


@st.composite
def ingest_bodies(draw):
    body = {
        "idempotency_key": draw(text),
        "source": {"corpus_id": draw(text), "namespace": draw(text), "record_key": draw(text)},
        "content": {"kind": "text", "text": draw(text)},
    }
    if draw(st.booleans()):
        body["title"] = draw(text)
    if draw(st.booleans()):
        body["provenance"] = {"origin": "client"} if draw(st.booleans()) else {}
    return body


def shuffled(obj, rnd):
    if isinstance(obj, dict):
        items = list(obj.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    return obj


def digest_of(body: dict, **dump_kwargs) -> bytes:
    return request_digest(decode_body(json.dumps(body, **dump_kwargs).encode(), IngestCommand))


@given(ingest_bodies(), st.randoms(), st.sampled_from([None, 2]), st.booleans())
def test_member_order_and_whitespace_do_not_matter(body, rnd, indent, ascii_only):
    # part1 Conventions: the same canonical request replays
    assert digest_of(body) == digest_of(shuffled(body, rnd), indent=indent, ensure_ascii=ascii_only)


@given(ingest_bodies(), text)
def test_the_key_is_not_part_of_the_request(body, other_key):
    assert digest_of(body) == digest_of({**body, "idempotency_key": other_key})


@given(ingest_bodies(), text)
def test_any_changed_value_changes_the_digest(body, new_text):
    changed = {**body, "content": {"kind": "text", "text": body["content"]["text"] + new_text}}
    assert digest_of(body) != digest_of(changed)  # part1: a different request conflicts


def test_spelled_out_default_equals_omitted():
    base = {"idempotency_key": "k", "source": {"corpus_id": "c", "namespace": "n", "record_key": "r"},
            "content": {"kind": "text", "text": "x"}}
    assert digest_of(base) == digest_of({**base, "provenance": None}) != digest_of({**base, "provenance": {}})
    assert digest_of({**base, "provenance": {}}) == digest_of({**base, "provenance": {"origin": "client"}})


def test_route_context_is_part_of_the_digest():
    cmd = msgspec.convert({"idempotency_key": "k", "source": {"corpus_id": "c", "namespace": "n", "record_key": "r"},
                           "content": {"kind": "text", "text": "x"}}, IngestCommand)
    assert request_digest(cmd, corpus="a") != request_digest(cmd, corpus="b")
