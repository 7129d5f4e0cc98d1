"""`bench ingest` judges its single-ingest targets on the medians of several runs
(bench/ingest_single.py `medians`), so that one run the machine disturbed decides nothing alone."""

import statistics

from hypothesis import given, strategies as st

from contentsvc.bench.ingest_single import medians

figure = st.floats(min_value=0.1, max_value=1e5, allow_nan=False)


def _run(throughput: float, p99: float) -> dict:
    return {"throughput_req_per_s": throughput, "p99_ms": p99}


def test_one_disturbed_run_among_three_decides_neither_target():
    # The outlier an earlier run met: 596 req/s with p99 74.3 ms beside two ordinary runs.
    judged = medians([_run(1262.4, 25.1), _run(596.0, 74.3), _run(1441.2, 21.6)])
    assert judged == {"median_run": 0, "median_throughput_req_per_s": 1262.4, "median_p99_ms": 25.1}


@given(st.lists(st.tuples(figure, figure), min_size=1, max_size=7))
def test_each_target_is_judged_on_the_median_of_its_own_figure(pairs):
    runs = [_run(t, p) for t, p in pairs]
    judged = medians(runs)
    # the figures shown are a real run's, the one of median throughput
    assert runs[judged["median_run"]]["throughput_req_per_s"] == judged["median_throughput_req_per_s"]
    assert judged["median_throughput_req_per_s"] == statistics.median_low([t for t, _ in pairs])
    assert judged["median_p99_ms"] == statistics.median_low([p for _, p in pairs])
