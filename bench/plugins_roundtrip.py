"""Scenario 1, the normalizer round trip: the first-party pdf plugin as a real process
(`contentsvc plugin serve pdf` on a loopback port), called through the engine's own
PluginClient (the materializer's path: one shared client, discovery once, keep-alive) with a
tiny one-page PDF by file:// reference; against the same extraction in-process (the plugin's
`normalize`, file read, sha256 check and bounded child process included), in the same run. The
difference is the protocol's cost: HTTP on loopback, JSON both ways, the server's thread hop and
log lines. The parse alone in this thread (no child process) is measured too, so that what the
bounded child costs each PDF is shown beside it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

from contentsvc.bench.driver import BenchError
from contentsvc.bench.stats import latency_summary
from contentsvc.bench.tiny_pdf import report_lines, tiny_pdf
from contentsvc.config.environment import CONFIG_VARIABLE, PLUGIN_TOKEN_VARIABLE, child_environment
from contentsvc.ids import new_id
from contentsvc.plugins.client import PluginClient, PluginTarget
from contentsvc.processes.local_service import free_port
from contentsvc_plugins.pdf.plugin import build, normalize, pdf_parts, read_input

TIMEOUT_S = 30.0  # the pdf manifest's retry.timeout_seconds
LOOP_CAP_S = 120.0  # no loop runs longer than this, whatever the count


class PdfPluginProcess:
    """`contentsvc plugin serve pdf --port P` on 127.0.0.1, its output in `log_path`, stopped by its pid."""

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        # open on loopback (no token), and no configuration file of the caller's
        env = {k: v for k, v in child_environment().items() if k not in (PLUGIN_TOKEN_VARIABLE, CONFIG_VARIABLE)}
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "contentsvc.cli", "plugin", "serve", "pdf",
                                         "--port", str(self.port)], env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise BenchError(f"the pdf plugin exited with {self.process.returncode} (log {log_path})")
            try:
                httpx.get(f"{self.endpoint}/v0/health", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise BenchError(f"the pdf plugin did not listen within 30 s (log {log_path})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()


def normalizer_request(path: Path, data: bytes, configuration: dict | None = None) -> dict[str, Any]:
    """The request the materializer sends (part 2 "Normalizer request"), for a file on this machine."""
    return {
        "invocation_id": new_id("inv"),
        "idempotency_key": f"bench:{hashlib.sha256(data).hexdigest()}",
        "contribution": "normalizer",
        "organization_id": "bench",
        "corpus_id": "bench",
        "record_id": "rec_bench",
        "record_version_id": "ver_bench",
        "source": {"corpus_id": "bench", "namespace": "bench", "record_key": path.name},
        "input": {"blob_id": "blob_bench", "media_type": "application/pdf", "size_bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest(), "reference": {"url": path.resolve().as_uri()}},
        "configuration": configuration or {},
    }


@contextmanager
def log_lines_to(path: Path) -> Iterator[None]:
    """The client's per-invocation log line is part of the path the materializer takes: it is kept,
    written to a file (as a service's log is) instead of the terminal."""
    handlers = [h for h in logging.getLogger().handlers if hasattr(h, "stream")]
    with open(path, "a") as sink:
        saved = [h.stream for h in handlers]
        for h in handlers:
            h.stream = sink
        try:
            yield
        finally:
            for h, stream in zip(handlers, saved):
                h.stream = stream


def in_process(extract: Callable[[], Any], calls: int, warm_up: int) -> list[float]:
    for _ in range(warm_up):
        extract()
    times, deadline = [], time.monotonic() + LOOP_CAP_S
    for _ in range(calls):
        started = time.perf_counter()
        extract()
        times.append((time.perf_counter() - started) * 1000)
        if time.monotonic() > deadline:
            break
    return times


async def through_plugin(target: PluginTarget, request: dict, calls: int, warm_up: int
                         ) -> tuple[list[float], list[float]]:
    """The normalizer's round trips, and GET /v0/health's on the same connection: the floor of any call
    (HTTP on loopback, no body, no handler), which says how much of the overhead is the HTTP stack."""
    async with PluginClient(target) as client:  # one client, as the materializer keeps one per pinned target
        for _ in range(warm_up):
            await client.invoke("normalizer", {**request, "invocation_id": new_id("inv")}, TIMEOUT_S)
        times, deadline = [], time.monotonic() + LOOP_CAP_S
        for _ in range(calls):
            body = {**request, "invocation_id": new_id("inv")}
            started = time.perf_counter()
            answer = await client.invoke("normalizer", body, TIMEOUT_S, body["invocation_id"])
            times.append((time.perf_counter() - started) * 1000)
            if not answer.get("manifest", {}).get("parts"):
                raise BenchError(f"the pdf plugin answered without Parts: {answer}")
            if time.monotonic() > deadline:
                break
        floor = []
        for _ in range(len(times)):
            started = time.perf_counter()
            await client.health()
            floor.append((time.perf_counter() - started) * 1000)
    return times, floor


def bench_roundtrip(workdir: Path, plugin_log: Path, client_log: Path, calls: int, warm_up: int) -> dict[str, Any]:
    data = tiny_pdf(*report_lines(1))
    path = workdir / "tiny.pdf"
    path.write_bytes(data)
    plugin = build()
    manifest = plugin.pinned.manifest
    request = normalizer_request(path, data)
    with asyncio.Runner() as loop:  # one event loop for every call, as the plugin server has
        expected = loop.run(normalize(request, manifest))
        local = in_process(lambda: loop.run(normalize(request, manifest)), calls, warm_up)
    # The parse alone, in this thread: what reading each PDF in a bounded child process costs on top.
    unbounded = in_process(lambda: pdf_parts(read_input(request["input"]), manifest.contributions.normalizer.max_parts),
                           calls, warm_up)
    process = PdfPluginProcess(plugin_log)
    try:
        target = PluginTarget(plugin.plugin_id, plugin.pinned.manifest.version, plugin.pinned.digest,
                              process.endpoint)
        with log_lines_to(client_log):
            remote, floor = asyncio.run(through_plugin(target, request, calls, warm_up))
            # the same answer both ways: what is compared is the same work
            answer = asyncio.run(_one(target, request))
    finally:
        process.stop()
    if answer != expected:
        raise BenchError("the plugin's answer differs from the in-process extraction")

    plugin_lat, local_lat, unbounded_lat = latency_summary(remote), latency_summary(local), latency_summary(unbounded)
    return {
        "pdf_bytes": len(data),
        "pages": 1,
        "calls": calls,
        "warm_up": warm_up,
        "plugin": plugin_lat,
        "in_process": local_lat,
        "health_get": latency_summary(floor),
        "unbounded_parse": unbounded_lat,
        "bounded_child_p50_ms": round(local_lat["p50_ms"] - unbounded_lat["p50_ms"], 2),
        "overhead_p50_ms": round(plugin_lat["p50_ms"] - local_lat["p50_ms"], 2),
        "overhead_p99_ms": round(plugin_lat["p99_ms"] - local_lat["p99_ms"], 2),
        "ratio_p50": round(plugin_lat["p50_ms"] / local_lat["p50_ms"], 2),
        "ratio_p99": round(plugin_lat["p99_ms"] / local_lat["p99_ms"], 2),
    }


async def _one(target: PluginTarget, request: dict) -> dict:
    async with PluginClient(target) as client:
        return await client.invoke("normalizer", request, TIMEOUT_S)
