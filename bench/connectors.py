"""`contentsvc bench connectors`: items pulled from RSS feeds into Receipts against plain batch
ingest of the same items, and the latency of a `service_key` push route.

Usage:
    contentsvc bench connectors [--items 10000] [--feeds 10] [--runs 3] [--pushes 2000]
                                [--concurrency 16] [--dataset DIR]

`contentsvc run` on a fresh database (its output in bench/results/connectors-server.log) with a
contentsvc.toml that launches the first-party `rss` plugin (loopback feeds allowed) and enables
the built-in `fixture` kind; the engine's vector space is off (CONTENTSVC_ENGINE_VECTORS=0), as
in the monitoring suite, so embedding does not take the cores being measured.

1. plain batch ingest: the --items SciFact documents as /v0/records/batch requests of 100, four
   at a time, from the first request to the last Receipt resolved; each document with the content
   the `rss` plugin makes of its feed item (a title Part and a body Part), so both phases make the
   same Records;
2. pull: the same documents as --feeds RSS 2.0 files served by an HTTP server on 127.0.0.1 in the
   bench process, one `rss` Connector each, from the first Connector created to the last Receipt
   resolved. A feed holds at most 1,000 items because an `rss` run reads one page of at most
   1,000 (decisions-part2), so the items come as several feeds rather than one; their runs
   proceed `[connectors] run_concurrency` at a time. Phases 1 and 2 run as --runs pairs, one
   after the other, each pair on Corpora of its own; the pull target is judged on the pair of
   median ratio, whose figures the summary shows beside every pair's ratio (single pairs at the
   same code spread from 0.65 to 0.82 on one machine);
3. push: --pushes requests of one item each to a fixture Connector's `ingest_key` route
   (`service_key`), --concurrency at a time, each timed from send to its 202, sent by the lean
   client of bench/http_load.py (httpx would take a share of the two cores as large as the API's).

Each phase starts once every fold has caught up with the journal: the indexing a phase leaves
behind its last Receipt is not charged to the next. A phase ends at its last Receipt's own
`resolved_at`, however late the bench looks (every 0.25 s: each look counts the Receipts table,
and looking every 50 ms took 2-3 % of the CPU the pull phase was measured on).

Targets (this 2-core machine): pull at least 0.7 of batch ingest's items per second; push p99 at
most 50 ms. The figures go to bench/results/connectors.json; nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
import time
import uuid
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import msgspec
import psycopg

from contentsvc.bench.driver import (
    DATASETS,
    RESULTS_DIR,
    BenchError,
    Run,
    closing_lines,
    fmt,
    judge,
    machine_line,
    target_lines,
    teller,
    write_results,
)
from contentsvc.bench.http_load import LoadClient, LoadError
from contentsvc.bench.monitoring_workload import load_documents, text_of
from contentsvc.bench.process_cpu import CpuAccount, busiest, counted
from contentsvc.bench.service import (
    JSON_HEADERS,
    OwnService,
    api_client,
    create_corpus,
    folds_caught_up,
    scan_server_log,
)
from contentsvc.bench.stats import Errors, cpu_seconds, latency_summary, median_low_index

RESULT_PATH = RESULTS_DIR / "connectors.json"
SERVER_LOG = RESULTS_DIR / "connectors-server.log"
RSS_MANIFEST = Path(__file__).resolve().parents[1] / "src" / "contentsvc_plugins" / "rss" / "contentsvc-plugin.json"
BATCH = 100
BATCH_CONCURRENCY = 4
WARM_UP_PUSHES = 200

TARGETS = {
    "pull_to_batch_ratio": {"op": ">=", "value": 0.7, "unit": "x"},
    "push_p99_ms": {"op": "<=", "value": 50.0, "unit": "ms"},
}


say = teller("connectors")


def item_content(doc: dict[str, str]) -> dict[str, Any]:
    """The content the `rss` plugin makes of the document's feed item (a title Part and a body
    Part), so that batch ingest and pull produce the same Records and the ratio compares like work."""
    return {"kind": "manifest", "parts": [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": doc["title"] or doc["_id"]}},
        {"key": "body", "role": "body", "content": {"kind": "text", "text": text_of(doc)}}]}


def rss_feed(docs: list[dict[str, str]]) -> bytes:
    entries = "".join(
        f"<item><title>{escape(doc['title'] or doc['_id'])}</title><guid isPermaLink=\"false\">{doc['_id']}"
        f"</guid><description>{escape(text_of(doc))}</description></item>" for doc in docs)
    return (f'<?xml version="1.0" encoding="UTF-8"?><rss version="2.0"><channel><title>SciFact</title>'
            f'<link>https://scifact.example/</link><description>bench</description>{entries}</channel></rss>'
            ).encode("utf-8")


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def serve_folder(folder: Path) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def deploy(folder: Path) -> Path:
    (folder / "rss").mkdir(parents=True)
    shutil.copy(RSS_MANIFEST, folder / "rss")
    from contentsvc.processes.local_service import free_port

    config = folder / "contentsvc.toml"
    config.write_text(
        f'[plugins.rss]\nendpoint = "http://127.0.0.1:{free_port()}"\nversion = "0.1.0"\n'
        f'manifest = "rss/contentsvc-plugin.json"\nlaunch = "rss"\n'
        f'configuration = {{ allow_private_networks = true }}\n\n'
        f'[connectors]\nfixture_enabled = true\ninterval_floor_seconds = 1\n')
    return config


async def wait_resolved(conn: psycopg.AsyncConnection, corpus_id: str, expected: int, cap_s: float) -> float:
    """When (time.time()) the last of `expected` Receipts of the Corpus resolved: its own
    `resolved_at`, stamped by the materializer on this machine's clock. Looked at every 0.25 s: the
    time comes from the Receipts, not from when the bench looked, so rare looks cost the measured
    phase no precision, and little of the CPU it measures (each look counts the Receipts table)."""
    deadline = time.perf_counter() + cap_s
    while True:
        cur = await conn.execute("SELECT count(*), max(resolved_at) FROM receipts WHERE corpus_id = %s"
                                 " AND state = 'resolved'", (corpus_id,))
        count, last = await cur.fetchone()
        if count >= expected:
            return last.timestamp()
        if time.perf_counter() > deadline:
            raise BenchError(f"{corpus_id}: {count} of {expected} Receipts resolved after {cap_s} s")
        await asyncio.sleep(0.25)


async def batch_ingest(client, conn, corpus_id: str, docs: list[dict[str, str]], cap_s: float,
                       key_prefix: str) -> dict[str, Any]:
    chunks = [docs[i:i + BATCH] for i in range(0, len(docs), BATCH)]
    gate = asyncio.Semaphore(BATCH_CONCURRENCY)
    errors = Errors()

    async def send(chunk):
        entries = [{"idempotency_key": f"b-{key_prefix}{doc['_id']}", "content": item_content(doc),
                    "source": {"corpus_id": corpus_id, "namespace": "scifact", "record_key": doc["_id"]}}
                   for doc in chunk]
        async with gate:
            r = await client.post("/v0/records/batch", content=msgspec.json.encode({"entries": entries}),
                                  headers=JSON_HEADERS)
        if r.status_code != 200 or any(item["status"] != 202 for item in r.json()["items"]):
            errors.add(str(r.status_code), r.text)

    started = time.time()  # wait_resolved answers on this clock
    await asyncio.gather(*(send(chunk) for chunk in chunks))
    if errors.total():
        raise BenchError(f"batch ingest refused: {errors.report()}")
    done = await wait_resolved(conn, corpus_id, len(docs), cap_s)
    return {"items": len(docs), "batch_size": BATCH, "concurrency": BATCH_CONCURRENCY,
            "seconds": round(done - started, 2), "items_per_s": round(len(docs) / (done - started), 1)}


async def pull(client, conn, corpus_id: str, base_url: str, feeds: int, items: int, cap_s: float) -> dict[str, Any]:
    started = time.time()  # wait_resolved answers on this clock
    connector_ids = []
    for n in range(feeds):
        r = await client.post("/v0/connectors", content=msgspec.json.encode({
            "idempotency_key": uuid.uuid4().hex, "corpus_id": corpus_id, "source_namespace": f"feed-{n}",
            "kind": "rss", "config": {"url": f"{base_url}/feed-{n}.rss"}, "schedule": {"interval_seconds": 86400}}),
            headers=JSON_HEADERS)
        if r.status_code != 201:
            raise BenchError(f"createConnector: {r.status_code} {r.text[:500]}")
        connector_ids.append(r.json()["connector_id"])
    done = await wait_resolved(conn, corpus_id, items, cap_s)
    cur = await conn.execute("SELECT state, count(*), sum(pages), sum(receipts_created) FROM connector_runs r"
                             " JOIN connectors c USING (connector_id) WHERE c.corpus_id = %s GROUP BY state",
                             (corpus_id,))
    runs = {state: {"runs": n, "pages": pages, "receipts_created": created}
            for state, n, pages, created in await cur.fetchall()}
    return {"items": items, "feeds": feeds, "items_per_feed": items // feeds, "runs": runs,
            "seconds": round(done - started, 2), "items_per_s": round(items / (done - started), 1)}


async def push(client, load: LoadClient, corpus_id: str, pushes: int, concurrency: int) -> dict[str, Any]:
    r = await client.post("/v0/connectors", content=msgspec.json.encode({
        "idempotency_key": uuid.uuid4().hex, "corpus_id": corpus_id, "source_namespace": "pushed", "kind": "fixture",
        "config": {"items": []}, "push_policy": {"rate_per_second": 1000, "burst": 10000}}), headers=JSON_HEADERS)
    if r.status_code != 201:
        raise BenchError(f"createConnector (fixture): {r.status_code} {r.text[:500]}")
    route = f"/v0/connectors/{r.json()['connector_id']}/api/ingest_key"
    latencies: list[float] = []
    errors = Errors()
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def worker():
        while not queue.empty():
            n = queue.get_nowait()
            body = msgspec.json.encode({"items": [{"record_key": f"p{n}", "revision": "1",
                                                   "text": f"pushed notice number {n}"}]})
            t0 = time.perf_counter()
            try:
                answer = await load.post(route, body)
            except LoadError as exc:
                errors.add(type(exc).__name__, str(exc))
                continue
            latencies.append((time.perf_counter() - t0) * 1000)
            if answer.status_code != 202:
                errors.add(str(answer.status_code), answer.text)

    async def send(numbers: range) -> None:
        for n in numbers:
            queue.put_nowait(n)
        await asyncio.gather(*(worker() for _ in range(concurrency)))

    await send(range(WARM_UP_PUSHES))  # connections opened, caches filled; not timed
    latencies.clear()
    cpu0, started = cpu_seconds(), time.perf_counter()
    await send(range(WARM_UP_PUSHES, WARM_UP_PUSHES + pushes))
    seconds = time.perf_counter() - started
    return {"pushes": pushes, "concurrency": concurrency, "route": "ingest_key (service_key, fixture kind)",
            "seconds": round(seconds, 2), "pushes_per_s": round(pushes / seconds, 1),
            "latency": latency_summary(latencies), "client_cpu_s": round(cpu_seconds() - cpu0, 2),
            "errors": errors.report()}


async def run_bench(workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    corpus = load_documents(args.dataset / "corpus.jsonl")
    # SciFact has 5,183 documents: past them the documents come round again under new ids.
    docs = [{**corpus[n % len(corpus)], "_id": f"{corpus[n % len(corpus)]['_id']}-{n // len(corpus)}"}
            for n in range(args.items)]
    feeds_folder = workdir / "feeds"
    feeds_folder.mkdir(parents=True)
    per_feed = -(-len(docs) // args.feeds)
    for n in range(args.feeds):
        (feeds_folder / f"feed-{n}.rss").write_bytes(rss_feed(docs[n * per_feed:(n + 1) * per_feed]))
    feed_server, base_url = serve_folder(feeds_folder)
    own, cpu = OwnService(SERVER_LOG), None
    try:
        target = own.start(home=workdir / "home", extra_env={"CONTENTSVC_CONFIG": str(deploy(workdir / "deploy")),
                                                             "CONTENTSVC_ENGINE_VECTORS": "0"})
        run_id = uuid.uuid4().hex[:6]
        cpu = CpuAccount(target.supervisor_pid, target.database_url)
        async with api_client(target, 64, timeout=60) as client, \
                await psycopg.AsyncConnection.connect(target.database_url, autocommit=True) as conn:
            pairs = []
            for n in range(args.runs):
                # Each pair on Corpora of its own: the same Records again, never a replay of the last.
                corpora = {name: await create_corpus(client, f"con-{run_id}-{name}-{n}") for name in ("batch", "pull")}
                say(f"pair {n + 1}/{args.runs}: plain batch ingest of {len(docs)} items ...")
                with counted(cpu) as batch_cpu:
                    batch = await batch_ingest(client, conn, corpora["batch"], docs, args.cap, f"{n}-")
                batch["cpu_s"] = batch_cpu
                say(f"batch: {fmt(batch['items_per_s'])} items/s; pull from {args.feeds} feeds ...")
                await folds_caught_up(conn, args.cap)
                with counted(cpu) as pull_cpu:
                    pulled = await pull(client, conn, corpora["pull"], base_url, args.feeds, len(docs), args.cap)
                pulled["cpu_s"] = pull_cpu
                pairs.append({"batch": batch, "pull": pulled,
                              "pull_to_batch_ratio": round(pulled["items_per_s"] / batch["items_per_s"], 3)})
                say(f"pull: {fmt(pulled['items_per_s'])} items/s, {pairs[-1]['pull_to_batch_ratio']}x batch")
                await folds_caught_up(conn, args.cap)
            say(f"{args.pushes} pushes at {args.concurrency} ...")
            push_corpus = await create_corpus(client, f"con-{run_id}-push")
            load = LoadClient(target.base_url, target.api_key, args.concurrency)
            try:
                pushed = await push(client, load, push_corpus, args.pushes, args.concurrency)
            finally:
                await load.aclose()
            say(f"push: p99 {pushed['latency']['p99_ms']} ms")
    finally:
        if cpu is not None:
            cpu.close()
        own.stop()
        feed_server.shutdown()
    judged = median_pair(pairs)
    return {**pairs[judged], "median_pair": judged, "pairs": pairs, "push": pushed}


def median_pair(pairs: list[dict[str, Any]]) -> int:
    """The index of the pair of batch and pull runs whose ratio is the median (the lower of the
    middle two for an even count): one pair the machine disturbed decides nothing alone, and the
    figures judged are a real pair's."""
    return median_low_index([pair["pull_to_batch_ratio"] for pair in pairs])


def summary_text(report: dict[str, Any]) -> str:
    res = report["results"]
    b, p, s = res["batch"], res["pull"], res["push"]
    lat = s["latency"]
    lines = ["", f"contentsvc bench connectors  {report['timestamp']}  {machine_line(report['machine'])}", "-" * 96,
             f"plain batch ingest: {b['items']:,} items in batches of {b['batch_size']} x{b['concurrency']}: "
             f"{fmt(b['items_per_s'])} items/s ({b['seconds']} s to the last Receipt resolved)",
             f"rss pull: {p['items']:,} items from {p['feeds']} feeds on loopback: {fmt(p['items_per_s'])} items/s "
             f"({p['seconds']} s), {res['pull_to_batch_ratio']}x batch",
             f"  {len(res['pairs'])} pairs, judged on the median ratio of "
             f"{', '.join(str(pair['pull_to_batch_ratio']) for pair in res['pairs'])}; the figures above are pair "
             f"{res['median_pair'] + 1}'s",
             f"push ({s['route']}): {s['pushes']} at concurrency {s['concurrency']}: {fmt(s['pushes_per_s'])}/s, "
             f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms, errors {s['errors']['total']}, "
             f"client CPU {s['client_cpu_s']} s",
             *(f"cpu s {phase} (pair {res['median_pair'] + 1}): {res[phase]['cpu_s']['total']} s  "
               f"{busiest(res[phase]['cpu_s'])}"
               for phase in ("batch", "pull") if res[phase].get("cpu_s")),
             "-" * 96]
    lines += target_lines(report)
    return "\n".join(lines + closing_lines(report, RESULT_PATH))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="contentsvc bench connectors", description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=10000, help="SciFact documents, as items (default 10000)")
    p.add_argument("--feeds", type=int, default=10, help="RSS feeds they are split into (default 10; an rss run "
                   "reads at most 1,000 items)")
    p.add_argument("--runs", type=int, default=3, help="pairs of batch and pull, one after the other (default 3; "
                   "the pair of median ratio is judged)")
    p.add_argument("--pushes", type=int, default=2000, help="push requests (default 2000)")
    p.add_argument("--concurrency", type=int, default=16, help="pushes in flight (default 16)")
    p.add_argument("--cap", type=float, default=600.0, help="the most a phase waits (default 600 s)")
    p.add_argument("--dataset", type=Path, default=DATASETS / "scifact", help="SciFact's folder")
    args = p.parse_args(argv)
    if args.items < 1 or not 1 <= args.feeds <= args.items or -(-args.items // args.feeds) > 1000:
        p.error("--items at least 1, split into --feeds of at most 1,000 items each")
    if args.pushes < 1 or args.concurrency < 1 or args.runs < 1:
        p.error("--runs, --pushes and --concurrency at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(list(argv))
    workdir = Path(tempfile.mkdtemp(prefix="contentsvc-bench-connectors-"))
    run = Run()
    try:
        results = asyncio.run(run_bench(workdir, args))
    except BenchError as exc:
        print(f"bench connectors failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run.finish()
    report = {
        **run.head("connectors"),
        "parameters": {"items": args.items, "feeds": args.feeds, "runs": args.runs, "pushes": args.pushes,
                       "concurrency": args.concurrency, "dataset": str(args.dataset),
                       "service": "contentsvc run (api + projectors + workers + the rss plugin), "
                                  "CONTENTSVC_ENGINE_VECTORS=0, started by the bench",
                       "feeds_served_by": "http.server on 127.0.0.1 in the bench process"},
        "machine": run.machine,
        "targets": judge(TARGETS, {"pull_to_batch_ratio": results["pull_to_batch_ratio"],
                                   "push_p99_ms": results["push"]["latency"]["p99_ms"]}),
        "results": results,
        "server_log": scan_server_log(SERVER_LOG),
    }
    write_results(RESULT_PATH, report)
    print(summary_text(report))
    return 0
