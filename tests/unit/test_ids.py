"""Generated ids sort by creation time (decisions.md: ULID-style, prefixed)."""

from hypothesis import given, strategies as st

from contentsvc.ids import new_id


@given(st.integers(2, 200))
def test_ids_are_strictly_increasing_within_a_process(n):
    ids = [new_id("rec") for _ in range(n)]
    assert ids == sorted(ids) and len(set(ids)) == n
    assert all(i.startswith("rec_") and len(i) == 30 for i in ids)
