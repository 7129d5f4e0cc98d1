"""`contentsvc bench upload`: presigned PUT throughput and the API's memory while it streams.

Usage:
    contentsvc bench upload [--size-mib 256] [--runs 3] [--workdir DIR]

The bench starts its own service like `contentsvc bench ingest` does (a
fresh database on the server of CONTENTSVC_DATABASE_URL, else
CONTENTSVC_TEST_DATABASE_URL, else an embedded PostgreSQL; `contentsvc run`
on a free port, its output in bench/results/upload-server.log), with
CONTENTSVC_HOME in a temporary work directory so that the blob store, the
source file and the copy all live on the same disk. Then:

  1. writes a --size-mib file of random bytes (fsync'd) and its SHA-256;
  2. the ceiling: a plain file copy on the same disk (shutil.copyfile, then
     fsync of the copy), --runs times;
     and five references (upload_references.py), --runs times each: the same
     client's PUT to a server that discards the body, the blob store's own
     hashing, writing and fsync of the file without HTTP, SHA-256 of the
     file alone in one thread (the bound of any store that hashes as it receives),
     the same client's PUT to a bare receiver with no framework that hashes,
     writes and fsyncs the body (what the PUT's own work allows here), and to
     a spliced receiver, the fastest arrangement of that work known here;
  3. --runs times: createUpload, then the presigned PUT of the file with
     httpx, streaming a generator of 1 MiB chunks with the Upload's
     put_headers, timed from the first byte sent to the 200 (the server has
     hashed, fsync'd and committed the Blob by then); confirmUpload must
     answer `verified`. Meanwhile the resident memory (VmRSS) of the API
     process (the `serve` child of `contentsvc run`) is sampled every 50 ms.

Rates are MB/s (10^6 bytes per second), best run of each. Targets: PUT
rate >= 80% of the copy rate; the API's peak RSS growth over its
pre-upload level < 64 MiB. The figures go to bench/results/upload.json with
each target's pass or miss; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx

from contentsvc.bench.driver import (target_lines, RESULTS_DIR, BenchError, Run, closing_lines, fmt, judge, machine_line,
                                     teller, write_results)
from contentsvc.bench.process_cpu import CpuAccount, counted
from contentsvc.bench.service import OwnService, scan_server_log
from contentsvc.bench.stats import machine_busy_seconds
from contentsvc.bench.upload_references import (bare_receiver_seconds, client_alone_seconds, durably_timed,
                                                spliced_receiver_seconds,
                                               hash_alone_seconds, store_alone_seconds)
from contentsvc.processes.children import supervised_children
from contentsvc.processes.registry import API

say = teller("upload")

RESULT_PATH = RESULTS_DIR / "upload.json"
SERVER_LOG = RESULTS_DIR / "upload-server.log"
MiB = 1024 * 1024
CHUNK = MiB
SAMPLE_S = 0.05

TARGETS = {
    "put_to_copy_ratio": {"op": ">=", "value": 0.80, "unit": "x copy"},
    "api_rss_growth_mib": {"op": "<", "value": 64, "unit": "MiB"},
}


# --------------------------------------------------------------------------- files


def make_source(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(CHUNK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
        f.flush()
        os.fsync(f.fileno())
    return h.hexdigest()


def timed_copy(src: Path, dst: Path) -> float:
    dst.unlink(missing_ok=True)
    return durably_timed(dst, lambda: shutil.copyfile(src, dst))


def file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


# --------------------------------------------------------------------------- the API process's memory


def _status(pid: int) -> dict[str, str]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            out[name] = value.strip()
    return out


def rss_bytes(pid: int) -> int:
    return int(_status(pid)["VmRSS"].split()[0]) * 1024


def serve_child(supervisor_pid: int) -> int:
    """The pid of the `serve` child of `contentsvc run` (the API process)."""
    api = supervised_children(supervisor_pid).get(API)
    if api is None:
        raise BenchError(f"no `serve` child of pid {supervisor_pid}")
    return api.pid


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = SAMPLE_S) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples: list[int] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self.samples.append(rss_bytes(self.pid))
            except OSError:
                pass
            self._stop_event.wait(self.every)

    def stop(self) -> list[int]:
        self._stop_event.set()
        self.join()
        return self.samples


# --------------------------------------------------------------------------- the upload


def create_upload(client: httpx.Client, size: int, sha256: str) -> dict:
    r = client.post("/v0/uploads", json={"idempotency_key": uuid.uuid4().hex, "media_type": "application/octet-stream",
                                         "size_bytes": size, "sha256": sha256, "filename": "bench.bin"})
    if r.status_code != 201:
        raise BenchError(f"createUpload: {r.status_code} {r.text[:300]}")
    return r.json()


def put_upload(upload: dict, source: Path, cpu: CpuAccount) -> tuple[float, dict[str, float], httpx.Response]:
    """Seconds the PUT took, the CPU seconds spent meanwhile (by the whole machine, the API
    process and this client's process), and its answer."""
    with httpx.Client(timeout=httpx.Timeout(300.0)) as anonymous:  # the presigned PUT carries no API key
        with counted(cpu) as used:
            busy, started = machine_busy_seconds(), time.perf_counter()
            r = anonymous.put(upload["put_url"], content=file_chunks(source), headers=upload["put_headers"])
            elapsed, busy = time.perf_counter() - started, machine_busy_seconds() - busy
    by_process = used["by_process"]
    return elapsed, {"machine_cpu_s": round(busy, 3), "api_cpu_s": by_process.get("api", 0.0),
                     "client_cpu_s": by_process.get("bench client", 0.0)}, r


def confirm(client: httpx.Client, upload_id: str) -> dict:
    r = client.post(f"/v0/uploads/{upload_id}/confirm")
    if r.status_code != 202:
        raise BenchError(f"confirmUpload: {r.status_code} {r.text[:300]}")
    return r.json()


def one_put(client: httpx.Client, api_pid: int, cpu: CpuAccount, source: Path, size: int,
            sha256: str) -> dict[str, Any]:
    upload = create_upload(client, size, sha256)
    baseline = rss_bytes(api_pid)
    sampler = RssSampler(api_pid)
    sampler.start()
    try:
        elapsed, used, r = put_upload(upload, source, cpu)
    finally:
        samples = sampler.stop()
    if r.status_code != 200:
        raise BenchError(f"PUT: {r.status_code} {r.text[:300]}")
    confirmed = confirm(client, upload["upload_id"])
    if confirmed["state"] != "verified":
        raise BenchError(f"upload not verified: {confirmed}")
    peak = max(samples + [baseline])
    return {
        "upload_id": upload["upload_id"],
        "seconds": round(elapsed, 3),
        "mb_per_s": round(size / elapsed / 1e6, 1),
        **used,
        "rss_baseline_mib": round(baseline / MiB, 1),
        "rss_peak_mib": round(peak / MiB, 1),
        "rss_growth_mib": round((peak - baseline) / MiB, 1),
        "rss_samples": len(samples),
    }


def warm_up(client: httpx.Client) -> None:
    """One small upload first, so that lazy setup (signing key, blob store, pools) is not counted."""
    data = os.urandom(64 * 1024)
    upload = create_upload(client, len(data), hashlib.sha256(data).hexdigest())
    r = httpx.put(upload["put_url"], content=data, headers=upload["put_headers"], timeout=60)
    if r.status_code != 200:
        raise BenchError(f"warm-up PUT: {r.status_code} {r.text[:300]}")
    confirm(client, upload["upload_id"])


def run_bench(own: OwnService, target, workdir: Path, size: int, runs: int) -> dict[str, Any]:
    source, copy = workdir / "source.bin", workdir / "copy.bin"
    say(f"writing {size // MiB} MiB of random bytes to {source} ...")
    sha256 = make_source(source, size)

    copies = []
    for i in range(runs):
        copies.append(timed_copy(source, copy))
        say(f"copy {i + 1}/{runs}: {size / copies[-1] / 1e6:,.0f} MB/s")

    # What bounds the PUT besides the API (upload_references.py): the same client to a server that
    # discards, the blob store's hashing and writing without HTTP, SHA-256 alone, and the same client
    # to a bare receiver doing the PUT's work with no framework around it, and to the fastest arrangement of that work.
    references: dict[str, list[float]] = {"client_alone": [], "store_alone": [], "hash_alone": [], "bare_receiver": [],
                                          "spliced_receiver": []}
    checked = {"Content-Length": str(size), "x-content-sha256": sha256}  # the receivers answer the digest
    for i in range(runs):
        references["client_alone"].append(client_alone_seconds(file_chunks(source), {"Content-Length": str(size)}))
        references["store_alone"].append(store_alone_seconds(source, workdir / "store-alone"))
        references["hash_alone"].append(hash_alone_seconds(source))
        references["bare_receiver"].append(bare_receiver_seconds(file_chunks(source), checked,
                                                                 workdir / "bare-receiver"))
        references["spliced_receiver"].append(spliced_receiver_seconds(file_chunks(source), checked,
                                                                       workdir / "spliced-receiver"))
        say(f"references {i + 1}/{runs}: " + ", ".join(
            f"{name.replace('_', ' ')} {size / seconds[-1] / 1e6:,.0f} MB/s" for name, seconds in references.items()))

    api_pid = serve_child(own.process.pid)
    puts = []
    cpu = CpuAccount(own.process.pid, target.database_url)
    try:
        with httpx.Client(base_url=target.base_url, headers={"Authorization": f"Bearer {target.api_key}"},
                          timeout=60) as client:
            warm_up(client)
            for i in range(runs):
                puts.append(one_put(client, api_pid, cpu, source, size, sha256))
                say(f"PUT {i + 1}/{runs}: {puts[-1]['mb_per_s']:,.0f} MB/s, API RSS +"
                    f"{puts[-1]['rss_growth_mib']} MiB")
    finally:
        cpu.close()
    source.unlink()

    def rates(seconds: list[float]) -> dict[str, Any]:
        per_s = [size / s / 1e6 for s in seconds]
        return {"runs_s": [round(s, 3) for s in seconds], "best_mb_per_s": round(max(per_s), 1),
                "median_mb_per_s": round(statistics.median(per_s), 1)}

    copy_best = max(size / s / 1e6 for s in copies)
    put_rates = [p["mb_per_s"] for p in puts]
    put_best = max(put_rates)
    reference_rates = {name: rates(seconds) for name, seconds in references.items()}
    best = {name: figures["best_mb_per_s"] for name, figures in reference_rates.items()}
    return {
        "file_bytes": size,
        "sha256": sha256,
        "copy": rates(copies),
        **reference_rates,
        "bare_receiver_to_copy_ratio": round(best["bare_receiver"] / copy_best, 3),
        "put_to_bare_receiver_ratio": round(put_best / best["bare_receiver"], 3),
        # Where this is under the target, no arrangement of the PUT's work known here meets it on this machine.
        "spliced_receiver_to_copy_ratio": round(best["spliced_receiver"] / copy_best, 3),
        # Where this is under the target, no PUT that hashes as it receives can meet it here.
        "hash_alone_to_copy_ratio": round(best["hash_alone"] / copy_best, 3),
        "put_to_client_alone_ratio": round(put_best / best["client_alone"], 3),
        "put_to_store_alone_ratio": round(put_best / best["store_alone"], 3),
        "put": {"runs": puts, "best_mb_per_s": put_best, "median_mb_per_s": round(statistics.median(put_rates), 1),
                "peak_rss_growth_mib": max(p["rss_growth_mib"] for p in puts)},
        "put_to_copy_ratio": round(put_best / copy_best, 3),
        # The work of one PUT (client, API, the kernel's threads) spread perfectly over every core:
        # no arrangement of that same work runs faster on this machine.
        "put_cpu_bound": cpu_bound(size, min(puts, key=lambda p: p["machine_cpu_s"]), copy_best),
        "api_pid": api_pid,
    }


def cpu_bound(size: int, put: dict[str, Any], copy_mb_per_s: float) -> dict[str, Any]:
    """The fastest rate the work of the PUT `put` allows on this machine's cores, its ratio to the
    copy, and who did the work: the API, the client, and the rest (the kernel's own threads)."""
    cores = len(os.sched_getaffinity(0))
    mb_per_s = size / (put["machine_cpu_s"] / cores) / 1e6
    return {"machine_cpu_s": put["machine_cpu_s"], "api_cpu_s": put["api_cpu_s"], "client_cpu_s": put["client_cpu_s"],
            "cores": cores, "mb_per_s": round(mb_per_s, 1), "to_copy_ratio": round(mb_per_s / copy_mb_per_s, 3)}


def judge_targets(results: dict[str, Any]) -> dict[str, Any]:
    return judge(TARGETS, {"put_to_copy_ratio": results["put_to_copy_ratio"],
                           "api_rss_growth_mib": results["put"]["peak_rss_growth_mib"]})


def summary_text(report: dict[str, Any]) -> str:
    res = report["results"]
    lines = ["", f"contentsvc bench upload  {report['timestamp']}  {machine_line(report['machine'])}", "-" * 96]
    lines.append(f"file                {res['file_bytes'] // MiB} MiB random bytes, on {report['parameters']['disk']}")
    lines.append(f"plain copy + fsync  best {fmt(res['copy']['best_mb_per_s'])} MB/s   median "
                 f"{fmt(res['copy']['median_mb_per_s'])} MB/s   ({len(res['copy']['runs_s'])} runs)")
    for name, label in (("client_alone", "client alone      "), ("store_alone", "store alone       "),
                        ("hash_alone", "SHA-256 alone     "), ("bare_receiver", "bare receiver     "),
                        ("spliced_receiver", "spliced receiver  ")):
        lines.append(f"{label}  best {fmt(res[name]['best_mb_per_s'])} MB/s   median "
                     f"{fmt(res[name]['median_mb_per_s'])} MB/s")
    lines.append(f"presigned PUT       best {fmt(res['put']['best_mb_per_s'])} MB/s   median "
                 f"{fmt(res['put']['median_mb_per_s'])} MB/s   ({len(res['put']['runs'])} runs, verified each)")
    lines.append(f"PUT / client alone  {res['put_to_client_alone_ratio']} (the fastest any server could take "
                 f"this client's bytes)")
    lines.append(f"PUT / store alone   {res['put_to_store_alone_ratio']} (the blob store's own code "
                 f"hashing and writing the same bytes without HTTP)")
    lines.append(f"SHA-256 / copy      {res['hash_alone_to_copy_ratio']} (one core's digest: the most any PUT "
                 f"that hashes as it receives could reach of the copy)")
    lines.append(f"bare / copy         {res['bare_receiver_to_copy_ratio']} (the PUT's own work in one thread with no "
                 f"framework: recv_into, SHA-256, write, fsync)")
    lines.append(f"PUT / bare          {res['put_to_bare_receiver_ratio']} (the service's PUT, hashing and writing in "
                 f"two threads, against that one thread)")
    lines.append(f"spliced / copy      {res['spliced_receiver_to_copy_ratio']} (the fastest arrangement of that work "
                 f"known here: os.splice into the file, hashed from a mapping")
    lines.append("                    in a second thread; it needs the raw socket, which the API never sees)")
    bound = res["put_cpu_bound"]
    lines.append(f"PUT's work          {bound['machine_cpu_s']} CPU-s of the machine per PUT (API {bound['api_cpu_s']}, "
                 f"client {bound['client_cpu_s']}, the rest kernel threads and idle services)")
    lines.append(f"                    on {bound['cores']} cores at most {fmt(bound['mb_per_s'])} MB/s, "
                 f"{bound['to_copy_ratio']} of the copy, however the work were arranged")
    lines.append(f"API RSS             peak growth {fmt(res['put']['peak_rss_growth_mib'])} MiB over "
                 f"{res['put']['runs'][0]['rss_baseline_mib']} MiB (sampled every {int(SAMPLE_S * 1000)} ms, "
                 f"pid {res['api_pid']})")
    lines.append("-" * 96)
    lines += target_lines(report)
    return "\n".join(lines + closing_lines(report, RESULT_PATH))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench upload", description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mib", type=int, default=256, help="size of the uploaded file (default 256)")
    p.add_argument("--runs", type=int, default=3, help="copies and PUTs each (default 3; the best counts)")
    p.add_argument("--workdir", type=Path, help="where the file, the copy and the blob store go (default: a "
                   "temporary directory)")
    args = p.parse_args(argv)
    if min(args.size_mib, args.runs) < 1:
        p.error("--size-mib and --runs are at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    workdir = Path(tempfile.mkdtemp(prefix="contentsvc-bench-upload-", dir=args.workdir))
    run = Run()
    size = args.size_mib * MiB
    own = OwnService(SERVER_LOG)
    try:
        target = own.start(home=workdir / "home")  # the blob store, on the same disk as the copy
        results = run_bench(own, target, workdir, size, args.runs)
    except BenchError as exc:
        print(f"bench upload failed: {exc}", file=sys.stderr)
        return 1
    finally:
        own.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    run.finish()
    report = {
        **run.head("upload"),
        "parameters": {"size_mib": args.size_mib, "runs": args.runs, "client_chunk_bytes": CHUNK,
                       "rss_sample_ms": int(SAMPLE_S * 1000), "disk": str(workdir.parent),
                       "http": "httpx.Client, HTTP/1.1, Content-Length body from a generator, client on the same "
                               "machine", "service": "contentsvc run (api + projectors), started by the bench"},
        "machine": run.machine,
        "targets": judge_targets(results),
        "results": results,
        "server_log": scan_server_log(SERVER_LOG),
    }
    write_results(RESULT_PATH, report)
    print(summary_text(report))
    return 0
