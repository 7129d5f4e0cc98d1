"""Which journal appends wake a worker (projectors/runner.py, schema/025): folds listen to every
append, workers that act on a few event families to those families' channels alone."""

from __future__ import annotations

from contentsvc.connectors.worker import ConnectorsWorker
from contentsvc.plugins.workers import PluginsWorker
from contentsvc.projectors.gc import GarbageCollector
from contentsvc.projectors.lexical import LexicalProjector
from contentsvc.projectors.runner import wake_channels


def test_a_fold_listens_to_every_append():
    assert wake_channels(LexicalProjector) == ["contentsvc_journal"]


def test_a_worker_listens_to_its_families_only():
    assert wake_channels(ConnectorsWorker) == ["contentsvc_journal_connector", "contentsvc_journal_plugin"]
    assert "contentsvc_journal" not in wake_channels(PluginsWorker)


def test_a_periodic_worker_listens_to_nothing():
    assert wake_channels(GarbageCollector) == []
