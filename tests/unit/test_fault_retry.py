"""The retry delay of a fault (projectors/faults.py): doubling from the first delay, capped, and
defined for any count of attempts (docs/decisions.md "Projector faults": a fault may last days)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contentsvc.projectors.faults import RETRY_CAP_SECONDS, retry_delay


def test_the_delay_doubles_from_one_second_to_a_minute():
    assert [retry_delay(a) for a in range(1, 9)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]


@given(st.integers(min_value=1, max_value=10**7), st.floats(min_value=0.001, max_value=10.0))
def test_any_count_of_attempts_has_a_delay_that_never_shrinks_and_never_passes_the_cap(attempt, first):
    # 2.0 ** 1100 overflows a float: a fault retried every minute for a day reached it
    assert first <= retry_delay(attempt, first) <= max(first, RETRY_CAP_SECONDS)
    assert retry_delay(attempt, first) <= retry_delay(attempt + 1, first)
