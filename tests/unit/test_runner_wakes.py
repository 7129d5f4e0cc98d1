"""Which journal appends wake a worker (projectors/runner.py, schema/025): folds listen to every
append, workers that act on a few event families to those families' channels alone."""

from __future__ import annotations

from contentsvc.connectors.worker import ConnectorsWorker
from contentsvc.plugins.workers import PluginsWorker
from contentsvc.projectors.gc import GarbageCollector
from contentsvc.projectors.lexical import LexicalProjector
from contentsvc.projectors.runner import Pace, wake_channels


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
