"""An evaluator whose answers break part 2's response rules, over one real `contentsvc run` pinning a
misbehaving build of the fixture evaluator (tests/fixtures/plugins/misbehaving_evaluator), run by
the test as a process: same manifest, fixtures and decisions, except on Records whose text holds
a marker word.

decisions-part2 "Evaluation": an answer that is not a valid one records no Match and sets the
Subscription's `evaluation.last_error` to `evaluator_invalid_output`. Evidence holding U+0000
(which no stored text can hold) is such an answer, not a failure of the `monitor` worker: it
goes on deciding the next Versions and records no fault (docs/decisions.md "Projector faults").
"""

from __future__ import annotations

import httpx
import psycopg
import pytest

from tests.conftest import until, create_corpus
from tests.e2e.conftest import new_org, saved_query, start_monitoring
from tests.e2e.test_evaluator_migration import subscribe
from tests.e2e.test_monitoring_flow import ingest, matches
from tests.integration.plugin_processes import PluginProcess

MODULE = "tests.fixtures.plugins.misbehaving_evaluator.plugin"
MARKERS = ("nul-evidence", "nul-details", "stray-part")


@pytest.fixture(scope="module")
def deployment(databases, tmp_path_factory):
    folder = tmp_path_factory.mktemp("evaluator-invalid-output")
    evaluator = PluginProcess("misbehaving-evaluator", folder, module=MODULE)
    deployment = start_monitoring(databases, folder, evaluator_endpoint=evaluator.base_url)
    yield deployment
    deployment.server.stop()
    evaluator.stop()


@pytest.fixture
def api(deployment):
    with deployment.client(new_org()) as client:
        yield client


def subscribe_to_cranes(api: httpx.Client, corpus_id: str) -> str:
    """A Subscription to Records of `corpus_id` containing "crane"."""
    return subscribe(api, saved_query(api, [corpus_id])["current_version_id"])


def last_error(api: httpx.Client, subscription_id: str) -> dict | None:
    view = api.get(f"/v0/subscriptions/{subscription_id}").json()
    return view if view["evaluation"].get("last_error") else None


def test_an_invalid_answer_records_no_match_and_the_monitor_goes_on(api, deployment):
    # One Corpus and Subscription per misbehaviour, so that each last_error is its own.
    watched = {}
    for marker in MARKERS:
        corpus = create_corpus(api)
        watched[marker] = (corpus, subscribe_to_cranes(api, corpus))
    for marker, (corpus, _) in watched.items():
        ingest(api, corpus, marker, f"A crane report, {marker}.")
    for marker, (corpus, subscription_id) in watched.items():
        view = until(lambda: last_error(api, subscription_id), f"the {marker} Subscription's last_error")
        assert view["evaluation"]["last_error"]["code"] == "evaluator_invalid_output", (marker, view)
        assert view["evaluation"]["pending"] == 0
        assert matches(api, subscription_id=subscription_id) == []

    # The same evaluator's valid answers still make Matches: the worker was not stopped.
    corpus = create_corpus(api)
    cranes = subscribe_to_cranes(api, corpus)
    record = ingest(api, corpus, "valid", "A crane report.")
    [match] = until(lambda: matches(api, subscription_id=cranes), "the valid answer's Match")
    assert match["record_id"] == record["record_id"] and match["state"] == "active"
    with psycopg.connect(deployment.url) as conn:
        assert conn.execute("SELECT name, error, message FROM projector_faults").fetchall() == []
