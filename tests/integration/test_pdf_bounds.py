"""The pdf normalizer reads each PDF in a child process under the configured memory and CPU
bounds, and kills it when the engine's wait is over (docs/decisions.md, "`pdf` bounds";
decisions-part2 "pdf": damaged bytes give an answer or a terminal error; part 2: an error's
`retryable` is authoritative). Real child processes, real pypdf, real files."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from contentsvc_plugins.pdf.bounded import READERS, READS_PER_READER, Bounds, _Reader, read_bounded
from contentsvc_plugins.pdf.plugin import build
from contentsvc_plugins.server import PluginError
from tests.conftest import until, until_async
from tests.fixtures.plugins.make_pdf import SAMPLE_PAGES, SAMPLE_TITLE, inflating, long_report, make_pdf


@pytest.fixture(scope="module")
def normalizer():
    handler = build().handlers["normalizer"]  # and starts the first reader
    return lambda request: asyncio.run(handler(request))  # the coroutine the plugin server awaits


def request_for(tmp_path, data: bytes, configuration: dict | None = None) -> dict:
    path = tmp_path / f"{hashlib.sha256(data).hexdigest()[:16]}.pdf"
    path.write_bytes(data)
    return {"contribution": "normalizer", "configuration": configuration or {},
            "input": {"blob_id": "blob_1", "media_type": "application/pdf", "size_bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest(), "reference": {"url": path.as_uri()}}}


def refusal(call, reader_ends: bool = True) -> PluginError:
    """The PluginError `call` raises; the reader that read the PDF has ended when the PDF went over a
    bound or the wait was over, and is reused otherwise."""
    reader = next_reader()
    with pytest.raises(PluginError) as raised:
        call()
    assert Path(f"/proc/{reader}").exists() is not reader_ends
    return raised.value


def next_reader() -> int:
    """The pid of the reader of the next PDF: the idle one, started here if none is idle."""
    READERS.warm()
    return READERS.next_pid()


def page_keys(answer: dict) -> list[str]:
    return [part["key"] for part in answer["manifest"]["parts"]]


def test_a_pdf_needing_more_cpu_than_allowed_is_refused_terminally(normalizer, tmp_path):
    error = refusal(lambda: normalizer(request_for(tmp_path, long_report(), {"max_cpu_seconds": 1})))
    assert (error.status, error.code, error.retryable) == (422, "pdf_limit_exceeded", False)
    assert "1 s of CPU" in error.message
    # the plugin goes on reading: the next PDF is answered as before
    answer = normalizer(request_for(tmp_path, make_pdf(SAMPLE_PAGES, SAMPLE_TITLE), {"max_cpu_seconds": 1}))
    assert page_keys(answer) == ["title", "page-1", "page-2"]


def test_a_pdf_needing_more_memory_than_allowed_is_refused_terminally(normalizer, tmp_path):
    # When earlier PDFs went through the reader (the test before this one's), the PDF is read again by
    # a fresh reader, whose refusal is the answer; the first reader ends either way.
    error = refusal(lambda: normalizer(request_for(tmp_path, inflating(), {"max_memory_mib": 128})))
    assert (error.status, error.code, error.retryable) == (422, "pdf_limit_exceeded", False)
    assert "128 MiB" in error.message
    # the lowest bound the configuration allows still reads an ordinary (compressed) PDF
    answer = normalizer(request_for(tmp_path, make_pdf(SAMPLE_PAGES, SAMPLE_TITLE, compress=True),
                                    {"max_memory_mib": 128}))
    assert page_keys(answer) == ["title", "page-1", "page-2"]
    assert "Bearings replaced" in answer["manifest"]["parts"][2]["content"]["text"]


def test_a_reader_still_busy_when_the_engine_stops_waiting_is_killed_and_the_answer_is_retryable(tmp_path):
    request = request_for(tmp_path, long_report())
    error = refusal(lambda: asyncio.run(read_bounded(request["input"], 256, Bounds(wall_seconds=0.5))))
    # a busy machine, not the bytes, may be why: the engine may try again
    assert (error.status, error.code, error.retryable) == (503, "pdf_read_timeout", True)


def test_the_child_reports_the_readers_own_refusals_unchanged(normalizer, tmp_path):
    request = request_for(tmp_path, b"%PDF-1.4 not really a PDF")
    reader = next_reader()
    error = refusal(lambda: normalizer(request), reader_ends=False)
    assert (error.status, error.code, error.retryable) == (422, "invalid_pdf", False)
    request["input"]["size_bytes"] += 1
    error = refusal(lambda: normalizer(request), reader_ends=False)
    assert (error.code, error.retryable) == ("blob_mismatch", False)
    # a request without a file:// reference is refused before any reader is taken
    error = refusal(lambda: normalizer({"input": {"reference": {"url": "https://example.com/a.pdf"}}}),
                    reader_ends=False)
    assert (error.status, error.code) == (400, "invalid_request")
    assert next_reader() == reader  # one reader answered all three, and reads the next PDF


def test_each_pdf_gets_its_own_cpu_bound_in_a_reused_reader(normalizer, tmp_path):
    # Ten PDFs of 0.15-0.5 s of CPU each (by the machine), all read by one reader bound to 1 s a PDF:
    # more than 1 s in all, so the time the earlier ones used does not count against the later ones.
    pages = [[f"page {n} of the shorter report", "more words on it"] for n in range(500)]
    reader = next_reader()
    used_before = sum(psutil.Process(reader).cpu_times()[:2])
    for n in range(10):
        answer = normalizer(request_for(tmp_path, make_pdf(pages, f"Shorter {n}"), {"max_cpu_seconds": 1}))
        assert len(answer["manifest"]["parts"]) == 256  # the title and the pages up to max_parts
    assert next_reader() == reader
    assert sum(psutil.Process(reader).cpu_times()[:2]) - used_before > 1  # what the test is about


def test_a_reader_killed_from_outside_is_a_retryable_answer_and_an_idle_one_is_passed_over(normalizer, tmp_path):
    # Killed while reading (the machine's OOM killer, an operator): not something the bytes decide.
    reader = next_reader()
    killer = threading.Timer(0.3, os.kill, (reader, signal.SIGKILL))
    killer.start()
    error = refusal(lambda: normalizer(request_for(tmp_path, long_report())))
    killer.join()
    assert (error.status, error.code, error.retryable) == (503, "pdf_read_interrupted", True)
    # Killed while idle: once that is known here, the next PDF is read by another reader, as if
    # nothing had happened. (A PDF arriving in the few milliseconds before is answered like the
    # one above: retryable.)
    reader = next_reader()
    os.kill(reader, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while READERS.next_pid() == reader and time.monotonic() < deadline:
        time.sleep(0.01)
    answer = normalizer(request_for(tmp_path, make_pdf(SAMPLE_PAGES, SAMPLE_TITLE)))
    assert page_keys(answer) == ["title", "page-1", "page-2"]
    assert next_reader() != reader


def test_a_reader_ends_after_its_share_of_pdfs_and_its_successor_waits_for_the_next(normalizer, tmp_path):
    first = next_reader()
    for n in range(READS_PER_READER):  # at most that many reads by any one reader (it may have read some already)
        sample = make_pdf(SAMPLE_PAGES, f"{SAMPLE_TITLE} {n}")
        assert page_keys(normalizer(request_for(tmp_path, sample))) == ["title", "page-1", "page-2"]
        if READERS.next_pid() != first:
            break
    # It ends once it has read its share, and its successor starts then, not when the next PDF
    # arrives (that PDF waited for the fork).
    successor = until(lambda: not Path(f"/proc/{first}").exists() and READERS.next_pid() not in (None, first)
                      and READERS.next_pid(), "the first reader ended and its successor idle", timeout=10)
    sample = make_pdf(SAMPLE_PAGES, f"{SAMPLE_TITLE} after")
    assert page_keys(normalizer(request_for(tmp_path, sample))) == ["title", "page-1", "page-2"]
    assert READERS.next_pid() == successor


def running_readers() -> set[int]:
    """Every reader process there is: the children of the forkserver this process started that
    have not ended (a process may end while it is looked at: then it is not running)."""
    def running(process: psutil.Process, started_by: str | None = None) -> bool:
        try:
            return process.status() != psutil.STATUS_ZOMBIE and (
                started_by is None or started_by in " ".join(process.cmdline()))
        except psutil.Error:
            return False

    forkserver = next(child for child in psutil.Process().children() if running(child, "multiprocessing.forkserver"))
    return {child.pid for child in forkserver.children() if running(child)}


class Starts:
    """How many reader starts are under way in threads: their readers may not be running yet."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        self._lock = threading.Lock()
        start = _Reader.start

        def counted() -> _Reader:
            with self._lock:
                self.count += 1
            try:
                return start()
            finally:
                with self._lock:
                    self.count -= 1

        monkeypatch.setattr(_Reader, "start", staticmethod(counted))


def test_no_reader_outlives_a_call_cancelled_while_its_reader_starts(normalizer, tmp_path, monkeypatch):
    # A call may be cancelled (the plugin server shutting down) while a thread starts its reader:
    # asyncio's cancellation interrupts only the wait, the thread goes on and its reader is nobody's.
    # That reader ends by itself: dropping it closes the parent's end of its pipe, which it reads as
    # end of file. Cancelled after 0 to 19 ms, so that some land while the reader is forking.
    starts_under_way = Starts(monkeypatch)

    async def cancelled_takes() -> None:
        held = await READERS.take()  # none is idle now, so each take() below forks one
        for delay_ms in range(20):
            task = asyncio.create_task(READERS.take())
            await asyncio.sleep(delay_ms / 1000)
            task.cancel()
            try:
                started = await task
            except asyncio.CancelledError:
                started = None
            # Once no thread is still starting one (a cancelled call's thread may be forking its
            # reader after the call ended), every reader running is held by this call or by the
            # task that finished.
            accounted = lambda: running_readers() <= {held.process.pid, started and started.process.pid}  # noqa: E731
            await until_async(lambda: not starts_under_way.count and accounted(), "every reader accounted",
                              timeout=10, every=0.01)
            if started is not None:
                started.stop()
        await until_async(lambda: running_readers() == {held.process.pid}, "only the held reader running",
                          timeout=10, every=0.01)
        await READERS.give_back(held)

    asyncio.run(cancelled_takes())
    answer = normalizer(request_for(tmp_path, make_pdf(SAMPLE_PAGES, SAMPLE_TITLE)))
    assert page_keys(answer) == ["title", "page-1", "page-2"]
