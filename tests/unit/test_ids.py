"""Generated ids sort by creation time (decisions.md: ULID-style, prefixed)."""

from hypothesis import given, strategies as st

from contentsvc.ids import _ALPHABET, _encode, new_id


@given(st.integers(2, 200))
def test_ids_are_strictly_increasing_within_a_process(n):
    ids = [new_id("rec") for _ in range(n)]
    assert ids == sorted(ids) and len(set(ids)) == n
    assert all(i.startswith("rec_") and len(i) == 30 for i in ids)


@given(st.integers(0, 2**130 - 1))
def test_the_table_encoder_writes_each_five_bits_as_one_character(value):
    # Crockford base32, most significant first: the layout every stored id has.
    expected = "".join(_ALPHABET[(value >> (5 * i)) & 31] for i in range(25, -1, -1))
    assert _encode(value) == expected


def test_ids_drawn_across_random_blocks_stay_distinct():
    ids = [new_id("evt") for _ in range(1000)]  # several blocks of random bytes
    assert len(set(ids)) == 1000 and ids == sorted(ids)
