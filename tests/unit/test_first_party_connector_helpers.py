"""The address guard, Retry-After reading and HTML reduction the first-party connectors share
(decisions-part2, "Plugin processes and first-party plugins": rss, social_list)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contentsvc_plugins.html_text import html_to_text
from contentsvc_plugins.server import PluginError
from contentsvc_plugins.source_http import guard_address, retry_after


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/feed", "http://10.0.0.8/feed", "http://172.16.4.1/feed", "http://192.168.1.1/feed",
    "http://169.254.169.254/latest", "http://[fd12:3456::1]/feed", "http://[fe80::1]/feed", "http://[::1]/feed",
    "http://0.0.0.0/feed", "http://[::ffff:127.0.0.1]/feed"])
def test_loopback_private_link_local_and_unique_local_are_refused(url):
    # decisions-part2 rss: refuse loopback, private, link-local and unique-local addresses
    with pytest.raises(PluginError) as refused:
        guard_address(url)
    assert (refused.value.code, refused.value.error_class) == ("address_not_allowed", "source")


def test_a_public_address_passes():
    # decisions-part2 rss: only those ranges are refused (an IP literal resolves without DNS)
    guard_address("https://93.184.216.34/feed.xml")
    guard_address("http://[2606:2800:220:1:248:1893:25c8:1946]/feed")


def test_retry_after_seconds_or_http_date():
    # decisions-part2 rss: transient errors carry retry_after_seconds from Retry-After (integer >= 1)
    now = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after("120", now) == 120
    assert retry_after("0", now) == 1
    assert retry_after("Sun, 01 Mar 2026 12:01:30 GMT", now) == 90
    assert retry_after("nonsense", now) == 60 and retry_after(None, now) == 60


def test_html_is_reduced_to_text():
    # decisions-part2 rss/social_list: body is HTML reduced to text
    html = "<p>Bearings on <b>crane&nbsp;four</b></p><script>x()</script><p>done &amp; dusted<br>ok</p>"
    assert html_to_text(html) == "Bearings on crane four\ndone & dusted\nok"


@given(st.text(alphabet=st.sampled_from("ab \t\r\n\f\v\u00a0\u2028x"), max_size=60))
def test_spacing_collapses_as_the_plain_rule_says(text):
    # Runs of spaces and tabs become one space, space around a line break goes, ends are trimmed:
    # the faster patterns of html_text give exactly what the plain ones give.
    expected = re.sub(r"\s*\n\s*", "\n", re.sub(r"[ \t\r\f\v\u00a0]+", " ", text)).strip()
    assert html_to_text(text) == expected
