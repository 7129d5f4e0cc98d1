"""`bench connectors` judges the pull target on the pair of batch and pull runs of median ratio
(bench/connectors.py `median_pair`), so that one pair the machine disturbed decides nothing alone."""

import statistics

from hypothesis import given, strategies as st

from contentsvc.bench.connectors import median_pair


def _pair(ratio: float) -> dict:
    return {"pull_to_batch_ratio": ratio}


def test_one_disturbed_pair_among_three_decides_nothing():
    # Ratios single runs gave on one machine at the same code: 0.653 beside 0.711 and 0.79.
    assert median_pair([_pair(0.711), _pair(0.653), _pair(0.79)]) == 0


@given(st.lists(st.floats(min_value=0.01, max_value=10.0, allow_nan=False), min_size=1, max_size=7))
def test_the_judged_pair_is_a_real_pair_of_median_ratio(ratios):
    judged = median_pair([_pair(r) for r in ratios])
    assert ratios[judged] == statistics.median_low(ratios)
