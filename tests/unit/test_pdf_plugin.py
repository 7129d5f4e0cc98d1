"""The pdf normalizer on bytes of every kind: an answer or a terminal plugin error, never an
exception of the parser (decisions-part2 "pdf"; part 2: retryable is authoritative)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


def test_bytes_after_the_end_of_file_marker_are_read_past():
    # decisions-part2 "pdf": a PDF that writers padded or appended to after its %%EOF (a stray "%",
    # a repeated marker, NULs, text) is still the PDF before it; pypdf before 6.17 refused the
    # first two with "startxref not found", hence the floor in pyproject.toml.
    for tail in (b"%", b"%%EOF\n%%EOF", b"\n\x00\x00", b"appended by a mail gateway\n"):
        parts, _ = pdf_parts(SAMPLE + tail, 256)
        assert [part["key"] for part in parts] == ["title", "page-1", "page-2"], tail


# A sample whose catalog names its pages "/Pages 99999999": pypdf before 5.1 allocated without bound (21 GB
# and the OOM killer in one test run). Read in a process of its own under an address-space limit, so
# that a parser regressing on it fails this test rather than the machine.
BOUNDED_READ = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from contentsvc_plugins.pdf.plugin import pdf_parts
from contentsvc_plugins.server import PluginError
from tests.fixtures.plugins.make_pdf import SAMPLE_PAGES, SAMPLE_TITLE, make_pdf
sample = make_pdf(SAMPLE_PAGES, SAMPLE_TITLE)
offset = sample.index(b"/Pages 2 0 R") + len(b"/Pages ")
try:
    parts, _ = pdf_parts(sample[:offset] + b"99999999" + sample[offset + 8:], 256)
    outcome = [part["key"] for part in parts]
except PluginError as error:
    outcome = error.code
# VmHWM, the peak of this program's own memory: getrusage's ru_maxrss would also count the parent's
# pages the child held between fork and exec (a test worker that loaded the embedding model: 1 GB).
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "max_rss_kib": peak}))
"""


def test_a_pdf_naming_an_absurd_object_number_is_read_in_bounded_memory():
    # decisions-part2 "pdf": damaged bytes give an answer or a terminal error; docs/decisions.md
    # (pypdf's floor): never unbounded memory, since the normalizer reads untrusted uploads.
    done = subprocess.run([sys.executable, "-c", BOUNDED_READ], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["outcome"] in ("invalid_pdf", "no_text") or isinstance(result["outcome"], list), result
    assert result["max_rss_kib"] < 256 * 1024, result  # 43 MB with pypdf 5.1 and later
