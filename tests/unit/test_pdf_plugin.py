"""The pdf normalizer on bytes of every kind: an answer or a terminal plugin error, never an
exception of the parser (decisions-part2 "pdf"; part 2: retryable is authoritative)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contentsvc_plugins.pdf.plugin import pdf_parts
from contentsvc_plugins.server import PluginError
from tests.fixtures.plugins.make_pdf import SAMPLE_PAGES, SAMPLE_TITLE, make_pdf

SAMPLE = make_pdf(SAMPLE_PAGES, SAMPLE_TITLE)


def outcome(data: bytes):
    try:
        parts, warnings = pdf_parts(data, 256)
    except PluginError as error:
        assert error.retryable is False and error.code in ("invalid_pdf", "no_text", "encrypted_pdf")
        return error.code
    assert parts and all(part["content"]["text"] for part in parts)
    return parts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=len(SAMPLE) - 1), st.binary(min_size=1, max_size=8))
def test_damaged_pdfs_answer_or_refuse_terminally(offset, garbage):
    outcome(SAMPLE[:offset] + garbage + SAMPLE[offset + len(garbage):])


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_are_refused_terminally(data):
    assert outcome(data) in ("invalid_pdf", "no_text") or isinstance(outcome(data), list)


def test_pages_beyond_max_parts_are_left_out_with_a_warning():
    data = make_pdf([[f"page {n}"] for n in range(1, 6)], "Title")
    parts, warnings = pdf_parts(data, 3)
    assert [part["key"] for part in parts] == ["title", "page-1", "page-2"]
    assert [warning["code"] for warning in warnings] == ["pages_truncated"]
