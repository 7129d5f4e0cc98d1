"""Cursors are opaque and tamper-evident (decisions.md Change feed; part1 rules 6, 14, 18)."""

import base64

import pytest
from hypothesis import given, strategies as st

from contentsvc.domain.cursors import CursorCodec, InvalidCursor

codec = CursorCodec(b"k" * 32)
fields = st.fixed_dictionaries(  # `kind` as listConnectors binds its cursor to its kind filter
    {"org": st.text(max_size=20), "corpus": st.text(max_size=20), "kind": st.text(max_size=20),
     "pos": st.integers(0, 2**62)}
)


@given(fields)
def test_round_trip(f):
    assert codec.decode(codec.encode("changes", **f), "changes") == {"k": "changes", **f}


@given(fields, st.data())
def test_any_flipped_bit_is_detected(f, data):
    raw = bytearray(base64.urlsafe_b64decode(codec.encode("changes", **f) + "=="))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))
    token = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    with pytest.raises(InvalidCursor):
        codec.decode(token, "changes")


@given(fields)
def test_a_cursor_of_another_kind_is_refused(f):
    # part1 rule 14: a change cursor or record cursor passed to listCorpora is invalid_cursor
    with pytest.raises(InvalidCursor):
        codec.decode(codec.encode("changes", **f), "corpora")


@given(fields)
def test_another_secret_is_refused(f):
    with pytest.raises(InvalidCursor):
        CursorCodec(b"x" * 32).decode(codec.encode("records", **f), "records")


@given(st.text(max_size=80))
def test_garbage_never_raises_anything_but_invalid_cursor(token):
    with pytest.raises(InvalidCursor):
        codec.decode(token, "changes")
