"""Reads PDFs in child processes, each PDF under a memory and a CPU-time limit of its own.

The normalizer parses bytes that anyone holding `blobs:write` uploads. A parser running in a
thread of the plugin cannot be stopped: a PDF that makes pypdf loop would keep that thread
spinning long after the engine gave up on the call (and retried it, starting another), and one
that makes it allocate without bound takes the machine's memory (pypdf before 5.1 reached 21 GB
on a 2 kB file). A child process can be bounded by the kernel (`RLIMIT_AS`, `RLIMIT_CPU`) and
killed, so a hostile PDF costs at most its bounds, once, and answers:

- more memory than `max_memory_mib`, or more CPU than `max_cpu_seconds`: `pdf_limit_exceeded`,
  terminal, since the same bytes under the same bounds give the same answer;
- no answer within the manifest's `retry.timeout_seconds` (a machine too busy, not the PDF):
  the child is killed and the answer is retryable, as the engine has timed out the call anyway;
- the child ending any other way: `invalid_pdf` when it died of a signal of its own doing (the
  parser crashed on these bytes), retryable when it was killed from outside (SIGKILL, the
  machine's OOM killer or an operator).

A reader is reused for up to `READS_PER_READER` PDFs, one at a time: a fork per PDF cost 9 ms
here, against half a millisecond for a one-page PDF's parse. Each PDF still gets its own bounds:
the CPU limit is set to the time used so far plus `max_cpu_seconds` before each one, and a
reader that ran out of memory after earlier reads may have been left with less than a fresh one
(fragmentation), so the PDF is read again by a fresh reader, and only a fresh reader's refusal
is the answer. A reader that ran out of memory or was killed is not reused (one found dead
while idle is passed over). Readers fork from a forkserver that has pypdf loaded, and at most
one per CPU reads at a time, so a burst of PDFs cannot hold more than that many times
`max_memory_mib`.
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import threading
from dataclasses import dataclass

import anyio

from contentsvc_plugins.server import PluginError, terminal

READS_PER_READER = 100  # then the reader ends and a fresh one takes its place: no drift lasts
_FORKSERVER = multiprocessing.get_context("forkserver")
_FORKSERVER.set_forkserver_preload(["pypdf", "contentsvc_plugins.pdf.plugin"])
_BUSY = anyio.Semaphore(os.cpu_count() or 2)  # readers reading at once


@dataclass(frozen=True)
class Bounds:
    """What one PDF may cost: the plugin configuration's limits, and the wall-clock time after
    which the engine no longer waits (the manifest's `retry.timeout_seconds`)."""

    max_memory_mib: int = 1024
    max_cpu_seconds: int = 20
    wall_seconds: float = 30.0

    @classmethod
    def of(cls, configuration: dict | None, wall_seconds: float) -> Bounds:
        configuration = configuration or {}
        return cls(max_memory_mib=configuration.get("max_memory_mib", cls.max_memory_mib),
                   max_cpu_seconds=configuration.get("max_cpu_seconds", cls.max_cpu_seconds),
                   wall_seconds=wall_seconds)


async def read_bounded(blob: object, max_parts: int, bounds: Bounds) -> tuple[list[dict], list[dict]]:
    """The Parts and warnings of the PDF the request's `input` refers to, read by a bounded child;
    a PluginError for every refusal, exactly as the child raised it or as its end decides. It
    waits for the child on the event loop; starting and ending readers go to a thread."""
    try:
        with anyio.fail_after(bounds.wall_seconds):
            await _BUSY.acquire()
    except TimeoutError:
        raise PluginError(503, "unavailable", "every PDF reader stayed busy", retryable=True) from None
    try:
        reader = await READERS.take()
        outcome = await reader.read((blob, max_parts, bounds), bounds)
        if _over_memory(outcome) and reader.reads > 1:
            # a reused reader may hold less than a fresh one: only a fresh one decides
            reader = await anyio.to_thread.run_sync(_Reader.start)
            outcome = await reader.read((blob, max_parts, bounds), bounds)
        await READERS.give_back(reader)
    finally:
        _BUSY.release()
    if isinstance(outcome, PluginError):
        raise outcome
    if outcome[0] == "error":
        status, code, message, retryable = outcome[1]
        raise PluginError(status, code, message, retryable=retryable)
    return outcome[1]


@dataclass
class _Reader:
    process: multiprocessing.process.BaseProcess
    conn: multiprocessing.connection.Connection  # the parent's end
    reads: int = 0

    @classmethod
    def start(cls) -> _Reader:
        conn, child_end = _FORKSERVER.Pipe()
        process = _FORKSERVER.Process(target=_serve_reads, args=(child_end,), daemon=True)
        process.start()
        child_end.close()  # the child holds the only other end: its death reads as end of file here
        return cls(process, conn)

    async def read(self, job: tuple, bounds: Bounds) -> tuple | PluginError:
        """The child's answer to one PDF, or the PluginError of how it ended without one."""
        self.reads += 1
        try:
            self.conn.send(job)  # a request's few fields: the pipe's buffer takes them at once
            with anyio.fail_after(bounds.wall_seconds):
                await anyio.wait_readable(self.conn.fileno())  # the answer, or the end of file of its death
            outcome = self.conn.recv()
        except TimeoutError:  # before OSError, of which it is a kind
            self.stop(kill=True)
            # The engine stopped waiting, and a busy machine, not the bytes, may be why.
            return PluginError(503, "pdf_read_timeout", f"reading the PDF did not finish within "
                               f"{bounds.wall_seconds:g} s", retryable=True)
        except (EOFError, OSError):  # the child ended without answering
            self.stop(kill=True)
            return _ended_without_answer(self.process.exitcode, bounds)
        except BaseException:  # the call itself was cancelled: the reader's state is unknown
            self.stop(kill=True)
            raise
        if _over_memory(outcome):
            self.stop()  # it ends after answering so: its memory may be spent
        return outcome

    def stop(self, kill: bool = False) -> None:
        if kill and self.process.is_alive():
            self.process.kill()
        self.conn.close()  # an idle reader ends on end of file
        self.process.join()

    @property
    def ended(self) -> bool:
        return self.conn.closed


class _Readers:
    """The idle readers: a request takes one (or starts one when none is idle) and gives it back
    after its PDF, unless it ended or has read its share."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Reader] = []

    async def take(self) -> _Reader:
        while True:
            with self._lock:
                reader = self._idle.pop() if self._idle else None
            if reader is None:
                return await anyio.to_thread.run_sync(_Reader.start)
            if reader.process.is_alive():
                return reader
            reader.stop()  # stopped from outside while idle: passed over (it has ended: no wait)

    async def give_back(self, reader: _Reader) -> None:
        if reader.ended:
            return
        if reader.reads >= READS_PER_READER:
            # Its successor starts beside this answer rather than when the next PDF arrives, which
            # waited for the fork (9 ms here) once every READS_PER_READER PDFs.
            threading.Thread(target=self._replace, args=(reader,), name="pdf-reader-successor", daemon=True).start()
            return
        self._keep(reader)

    def _replace(self, reader: _Reader) -> None:
        reader.stop()
        self._keep(_Reader.start())

    def _keep(self, reader: _Reader) -> None:
        with self._lock:
            self._idle.append(reader)

    def warm(self) -> None:
        """Start the forkserver (pypdf loaded: a few hundred ms) and one reader, when none is idle."""
        if self.next_pid() is None:
            self._keep(_Reader.start())

    def next_pid(self) -> int | None:
        """The process that reads the next PDF: the last idle reader still running, if any."""
        with self._lock:
            alive = [reader for reader in self._idle if reader.process.is_alive()]
        return alive[-1].process.pid if alive else None


READERS = _Readers()


def _over_memory(outcome: tuple | PluginError) -> bool:
    return isinstance(outcome, tuple) and outcome[0] == "error" and outcome[1][1] == "pdf_limit_exceeded"


def _ended_without_answer(exitcode: int | None, bounds: Bounds) -> PluginError:
    if exitcode == -signal.SIGXCPU:
        return terminal("pdf_limit_exceeded", f"reading the PDF took more than {bounds.max_cpu_seconds} s of CPU")
    if exitcode == -signal.SIGKILL:
        # Killed from outside (the machine's OOM killer, an operator): not something these bytes decide.
        return PluginError(503, "pdf_read_interrupted", "the PDF reader was stopped", retryable=True)
    return terminal("invalid_pdf", f"the PDF reader ended without an answer (exit {exitcode})")


def _serve_reads(conn) -> None:
    """A reader child: one PDF at a time, each under its own bounds, until the parent closes the pipe."""
    gc.freeze()  # objects from before the fork stay out of collections: scanning them copied their pages
    # pypdf's messages quote document content: kept out of the plugin's output, as in the plugin itself.
    logging.getLogger("pypdf").addHandler(logging.NullHandler())
    from contentsvc_plugins.pdf.plugin import pdf_parts, read_input

    while True:
        try:
            blob, max_parts, bounds = conn.recv()
        except EOFError:
            return
        _bound(bounds)
        over_memory = ("error", (422, "pdf_limit_exceeded",
                                 f"reading the PDF needed more than {bounds.max_memory_mib} MiB", False))
        try:
            outcome: tuple = ("parts", pdf_parts(read_input(blob), max_parts))
        except PluginError as error:
            outcome = ("error", (error.status, error.code, error.message, error.retryable))
        except MemoryError:
            outcome = over_memory
        try:
            conn.send(outcome)
        except MemoryError:  # the answer itself did not fit
            outcome = over_memory
            conn.send(outcome)
        if outcome is over_memory:
            return
        del outcome
        gc.collect()  # what this PDF left in cycles is not counted against the next one


def _bound(bounds: Bounds) -> None:
    """This PDF's limits. Only the soft limits move (the hard ones stay unlimited, so a later PDF
    may be allowed more); the CPU limit counts from now. SIGXCPU at the soft CPU limit ends the
    process, its default action."""
    memory = bounds.max_memory_mib * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, resource.RLIM_INFINITY))
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime) + bounds.max_cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))
