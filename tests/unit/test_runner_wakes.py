"""Which journal appends wake a worker (projectors/runner.py, schema/025): folds listen to every
append, workers that act on a few event families to those families' channels alone; and when a
fold rests in a burst of ingests (runner.IngestBurst)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contentsvc.connectors.worker import ConnectorsWorker
from contentsvc.monitoring.deliverer import DeliveriesWorker
from contentsvc.monitoring.monitor import MonitorWorker
from contentsvc.plugins.workers import PluginsWorker
from contentsvc.projectors.gc import GarbageCollector
from contentsvc.projectors.lexical import LexicalProjector
from contentsvc.projectors.materializer import MaterializerProjector
from contentsvc.projectors.readmodel import ReadModelProjector
from contentsvc.projectors.runner import IngestBurst, Pace, wake_channels
from contentsvc.projectors.vectors import VectorProjector


def test_a_fold_listens_to_every_append():
    assert wake_channels(LexicalProjector) == ["contentsvc_journal"]


def test_a_worker_listens_to_its_families_only():
    assert wake_channels(ConnectorsWorker) == ["contentsvc_journal_connector", "contentsvc_journal_plugin"]
    assert "contentsvc_journal" not in wake_channels(PluginsWorker)


def test_a_periodic_worker_listens_to_nothing():
    assert wake_channels(GarbageCollector) == []


def test_commits_are_gathered_only_while_they_come_quickly():
    # A lone write is folded at once (freshness); a stream of them, in batches (throughput).
    pace = Pace()
    assert not any(pace.busy_after_wake(t * 0.3) for t in range(20))  # about three a second: quiet
    assert [pace.busy_after_wake(10 + t * 0.01) for t in range(Pace.BUSY_WAKES)][-1]  # eight within 80 ms
    assert not pace.busy_after_wake(15.0)  # after a pause, the next one is quiet again


def test_the_journals_folds_rest_in_bursts_and_workers_do_not():
    for fold in (MaterializerProjector, ReadModelProjector, LexicalProjector):
        burst = IngestBurst.of(fold, 10)
        assert burst.seconds == 10 and not burst.whole_burst
        assert wake_channels(fold, burst.rests) == ["contentsvc_journal", "contentsvc_journal_ingest",
                                                    "contentsvc_journal_withdrawal"]
    # The monitor's webhooks would wait; deliveries wait on receivers, not on the cores; the
    # others are woken by their families alone.
    for worker in (MonitorWorker, DeliveriesWorker, ConnectorsWorker, PluginsWorker, GarbageCollector):
        assert not IngestBurst.of(worker, 10).rests
    assert wake_channels(DeliveriesWorker, IngestBurst.of(DeliveriesWorker, 10).rests) == ["contentsvc_journal"]
    # Embedding lags by design and no 429 counts it: it rests through the whole burst.
    assert IngestBurst.of(VectorProjector, 10).whole_burst
    for fold in (LexicalProjector, VectorProjector):
        assert not IngestBurst.of(fold, 0).rests  # [processes] ingest_burst_seconds = 0: never


def test_a_fold_rests_only_while_behind_and_ingests_arrive():
    burst = IngestBurst("fold", seconds=10)
    assert burst.rest_after(0.02, more=True, now=0.0) == 0  # behind, but nothing arrives
    burst.heard("contentsvc_journal")  # another fold's commit is not an ingest
    assert burst.rest_after(0.02, more=True, now=0.0) == 0
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.02, more=True, now=0.0) == 0.02 * IngestBurst.REST_FACTOR
    burst.heard("contentsvc_journal_ingest")  # halfway through its burst time: half the rest
    assert burst.rest_after(0.02, more=True, now=5.0) == pytest.approx(0.02 * IngestBurst.REST_FACTOR / 2)
    burst.heard("contentsvc_journal_withdrawal")
    assert burst.rest_after(1.5, more=True, now=0.5) == IngestBurst.MAX_REST_SECONDS  # capped
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.02, more=False, now=2.0) == 0  # caught up: no rest
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.02, more=True, now=20.0) > 0  # a new burst counts from its start
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.02, more=True, now=31.0) == 0  # ten seconds behind: full speed


def test_a_fold_whose_lag_is_by_design_rests_whenever_ingests_arrive():
    burst = IngestBurst("fold", seconds=10, whole_burst=True)
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.1, more=False, now=0.0) == 0.1 * IngestBurst.REST_FACTOR  # caught up, still rests
    burst.heard("contentsvc_journal_ingest")
    assert burst.rest_after(0.1, more=True, now=60.0) > 0  # and beyond the burst time
    assert burst.rest_after(0.1, more=True, now=61.0) == 0  # nothing arrived


@given(st.lists(st.tuples(st.floats(0, 2), st.booleans(), st.booleans(), st.floats(0, 3)), max_size=60),
       st.integers(0, 30), st.booleans())
def test_rests_are_bounded_by_the_step_and_need_arriving_ingests(steps, seconds, whole_burst):
    burst = IngestBurst("fold", seconds=seconds, whole_burst=whole_burst)
    now, behind_since = 0.0, None
    for step_seconds, more, ingest_arrived, pause in steps:
        now += step_seconds + pause
        if ingest_arrived:
            burst.heard("contentsvc_journal_ingest")
        rest = burst.rest_after(step_seconds, more, now)
        behind_since = (behind_since if behind_since is not None else now) if more else None
        # At most REST_FACTOR times the step: a resting fold keeps a sixth of its speed.
        assert 0 <= rest <= min(IngestBurst.MAX_REST_SECONDS, IngestBurst.REST_FACTOR * step_seconds)
        if rest:
            assert ingest_arrived and seconds > 0
            assert whole_burst or (more and now - behind_since < seconds)
        now += rest
