"""The plugin client's pure parts: the retry backoff schedule and the plugin error body
(decisions-part2, "How the service calls plugins")."""

from __future__ import annotations

import asyncio

from hypothesis import given
from hypothesis import strategies as st

from contentsvc.plugins.client import PluginClients, PluginTarget, backoff_delay, plugin_error
from contentsvc.plugins.contract_check.report import Issue, Recorder

units = st.floats(min_value=0.0, max_value=1.0)


@given(st.integers(min_value=1, max_value=10_000), units)
def test_backoff_stays_within_jitter_of_the_doubling_schedule(attempt, unit):
    # decisions-part2: retried with backoff 1, 2, 4 ... 60 s (jitter keeps retries from marching together)
    base = min(60.0, 2.0 ** min(attempt - 1, 16))
    delay = backoff_delay(attempt, unit)
    assert 0.9 * base - 1e-9 <= delay <= min(60.0, 1.1 * base) + 1e-9
    assert delay <= 60.0


@given(st.integers(min_value=1, max_value=100), units)
def test_backoff_never_shrinks_beyond_the_jitter(attempt, unit):
    assert backoff_delay(attempt + 1, unit) >= backoff_delay(attempt, unit)


def test_the_schedule_without_jitter():
    assert [backoff_delay(n, 0.5) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]


@given(st.integers(min_value=-5, max_value=0), units)
def test_attempts_below_one_count_as_the_first(attempt, unit):
    assert backoff_delay(attempt, unit) == backoff_delay(1, unit)


def test_the_error_body_is_the_error_object_with_connector_members():
    # part 2 "Plugin error body": retryable authoritative; connector errors add error_class, retry_after_seconds
    error = plugin_error(503, {"code": "http_503", "message": "down", "retryable": True, "error_class": "transient",
                               "retry_after_seconds": 30})
    assert (error.code, error.retryable, error.error_class, error.retry_after_seconds) == \
        ("http_503", True, "transient", 30)
    wrapped = plugin_error(422, {"error": {"code": "no_text", "message": "m", "retryable": False}})
    assert (wrapped.code, wrapped.retryable) == ("no_text", False)


@given(st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()),
                 st.dictionaries(st.sampled_from(["code", "message", "detail"]), st.text())))
def test_anything_without_code_message_and_boolean_retryable_is_not_an_error_body(body):
    # decisions-part2: a non-2xx without the error envelope means unreachable, not a plugin decision
    assert plugin_error(500, body) is None


def test_a_target_never_shows_its_token():
    # decisions-part2 "Logging": plugin tokens are never logged
    target = PluginTarget("pdf", "0.1.0", "0" * 64, "http://127.0.0.1:8095/", token="sekret")
    assert "sekret" not in repr(target)
    assert target.url("contributions/normalizer") == "http://127.0.0.1:8095/v0/contributions/normalizer"


def test_one_kept_client_per_pinned_target():
    # A registration's endpoint, token and build never change, so a holder shares one client (its
    # pooled connections and verified discovery) per target; a different token is another target.
    clients = PluginClients()
    target = PluginTarget("query", "0.1.0", "0" * 64, "http://127.0.0.1:8097", token="a")
    first = clients.client(target)
    assert clients.client(PluginTarget("query", "0.1.0", "0" * 64, "http://127.0.0.1:8097", token="a")) is first
    other = clients.client(PluginTarget("query", "0.1.0", "0" * 64, "http://127.0.0.1:8097", token="b"))
    assert other is not first and other.target.token == "b"
    asyncio.run(clients.aclose())
    assert first.http.is_closed and other.http.is_closed
    assert clients.client(target) is not first  # closed clients are not handed out again


def test_a_plugins_words_and_the_reports_quoting_them_are_storable():
    # docs/decisions.md Plugins: no stored text holds U+0000; an error's words, a retry_after past a day
    error = plugin_error(503, {"code": "busy\x00", "message": "down\x00", "retryable": True,
                               "retry_after_seconds": 10 ** 12})
    assert (error.code, error.message, error.retry_after_seconds) == ("busy\ufffd", "down\ufffd", 86400)
    check = Recorder().add("health.ok", [Issue("x", "quotes a\x00", "/member\x00")])
    assert [(i.message, i.path) for i in check.issues] == [("quotes a\ufffd", "/member\ufffd")]
