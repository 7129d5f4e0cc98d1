"""`contentsvc bench search`: relevance, latency, freshness and replay on SciFact.

Ingests the SciFact corpus through the HTTP API into a service it starts,
then scores the 300 test queries (only the query ids present in
qrels/test.tsv, as SOURCE.md says) in lexical, semantic and hybrid mode
through HTTP, next to a plain PostgreSQL full-text baseline (tsvector,
GIN, ts_rank_cd) on the same documents and queries. Queries go through the
lean keep-alive client the ingest bench times with (bench/http_load.py):
httpx's own CPU, about a millisecond a request on these two cores, was part
of every latency measured before. Then, on a quiet
service, a lexical replay next to its ceiling measured in the same run
(Tantivy alone indexing the same texts), and last the lexical latency when every hit is a long
Version (hundreds of abstracts in one text). Writes bench/results/search.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import msgspec
import psycopg
import tantivy

from contentsvc.bench.http_load import LoadClient
from contentsvc.bench.driver import (DATASETS, RESULTS_DIR, BenchError, Progress, Run, closing_lines, judge,
                                     machine_line, target_lines, teller, write_results)
from contentsvc.bench.service import OwnService, api_client, create_corpus, folds_caught_up
from contentsvc.bench.stats import latency_summary
from contentsvc.search.lexical_index import WRITER_HEAP_PER_THREAD

say = teller("search")

DATASET = DATASETS / "scifact"
RESULT_PATH = RESULTS_DIR / "search.json"
SERVER_LOG = RESULTS_DIR / "search-server.log"
CORPUS = "scifact"
MODES = ("lexical", "semantic", "hybrid")
PUBLISHED_BM25_NDCG10 = 0.665  # BEIR, Table 2 (SOURCE.md)
TARGETS = {
    "lexical_ndcg10_vs_published_bm25": {"op": ">=", "value": PUBLISHED_BM25_NDCG10, "unit": "nDCG@10"},
    # Hybrid's own quality target is `bench quality`'s (SciFact hybrid at least 0.720).
    "lexical_p50_ms": {"op": "<=", "value": 3, "unit": "ms"},
    "hybrid_p50_ms": {"op": "<=", "value": 50, "unit": "ms"},
    "freshness_p50_ms": {"op": "<=", "value": 1000, "unit": "ms"},
    "replay_parts_per_s": {"op": ">=", "value": 10000, "unit": "Parts/s"},
}
API_MAX_LIMIT = 50
LONG_CORPUS = "long"
LONG_VERSIONS = 20
LONG_ABSTRACTS = 250  # SciFact abstracts joined into one long Version: about 370 KB of text


def load_dataset(root: Path):
    docs = [json.loads(line) for line in open(root / "corpus.jsonl")]
    queries = {q["_id"]: q["text"] for q in map(json.loads, open(root / "queries.jsonl"))}
    qrels: dict[str, dict[str, int]] = {}
    for i, line in enumerate(open(root / "qrels" / "test.tsv")):
        if i == 0:
            continue
        q, d, score = line.rstrip("\n").split("\t")
        qrels.setdefault(q, {})[d] = int(score)
    return docs, {q: queries[q] for q in qrels}, qrels


def ndcg_at(ranked: list[str], rel: dict[str, int], k: int = 10) -> float:
    dcg = sum((2 ** rel.get(d, 0) - 1) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(rel.values(), reverse=True)[:k]
    idcg = sum((2 ** r - 1) / math.log2(i + 2) for i, r in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at(ranked: list[str], rel: dict[str, int], k: int) -> float:
    return len(set(ranked[:k]) & set(rel)) / len(rel)


def entry(doc: dict, corpus: str = CORPUS) -> dict:
    """A collection document as an ingest command (the Corpus, also its namespace and key prefix)."""
    return {"idempotency_key": f"{corpus}-{doc['_id']}",
            "source": {"corpus_id": corpus, "namespace": corpus, "record_key": doc["_id"]},
            "title": doc["title"] or None, "content": {"kind": "text", "text": doc["text"] or doc["title"] or "-"}}


async def ingest_all(client: httpx.AsyncClient, docs: list[dict], corpus: str = CORPUS) -> float:
    started = time.perf_counter()
    sem = asyncio.Semaphore(4)

    async def send(batch):
        async with sem:
            r = await client.post("/v0/records/batch", json={"entries": [entry(d, corpus) for d in batch]})
            if r.status_code != 200:
                raise BenchError(f"batch ingest answered {r.status_code}: {r.text[:300]}")

    await asyncio.gather(*(send(docs[i:i + 100]) for i in range(0, len(docs), 100)))
    return time.perf_counter() - started


def wait_ready(database_url: str, n: int, cap_s: float) -> dict:
    """Until every Version is searchable and enriched; returns the times each was reached."""
    started = time.perf_counter()
    out = {"searchable_s": None, "enriched_s": None}
    progress = Progress("search")
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.perf_counter() - started < cap_s:
            searchable, enriched = conn.execute(
                "SELECT count(*) FILTER (WHERE searchable), count(*) FILTER (WHERE enriched) FROM versions"
                " WHERE corpus_id = %s", (CORPUS,)).fetchone()
            now = round(time.perf_counter() - started, 1)
            if searchable >= n and out["searchable_s"] is None:
                out["searchable_s"] = now
            if enriched >= n:
                out["enriched_s"] = now
                break
            progress.show(f"searchable {searchable}/{n}  enriched {enriched}/{n}")
            time.sleep(1.0)
    progress.done()
    return out


def planner_statistics(database_url: str) -> str:
    """Searches are measured as a deployment serves them a few minutes after a load: with the
    planner's statistics of the new rows, which autovacuum gathers within a minute. Where the
    server runs with autovacuum off, the bench gathers them itself (ANALYZE), and says so."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        if conn.execute("SHOW autovacuum").fetchone()[0] == "on":
            return "autovacuum"
        conn.execute("ANALYZE")
        return "ANALYZE by the bench (the server's autovacuum is off)"


async def run_queries(client: LoadClient, queries: dict[str, str], mode: str, concurrency: int,
                      id_of: dict[str, str], limit: int = API_MAX_LIMIT, corpus: str = CORPUS):
    latencies: list[float] = []
    rankings: dict[str, list[str]] = {}
    errors = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(qid: str, text: str):
        nonlocal errors
        async with sem:
            t = time.perf_counter()
            r = await client.post("/v0/search", msgspec.json.encode(
                {"query": text[:8192], "corpus_ids": [corpus], "mode": mode, "limit": limit}))
            latencies.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200:
                errors += 1
                return
            rankings[qid] = [id_of[h["record_id"]] for h in r.json()["items"]]

    started = time.perf_counter()
    await asyncio.gather(*(one(q, t) for q, t in queries.items()))
    return rankings, latencies, errors, time.perf_counter() - started


def score(rankings: dict[str, list[str]], qrels: dict, depth: int = API_MAX_LIMIT,
          top10: dict[str, list[str]] | None = None) -> dict:
    """nDCG@10 (of `top10` when given: the answers to a search of 10 hits) and recall@depth."""
    n = len(qrels)
    top10 = rankings if top10 is None else top10
    return {
        "ndcg@10": round(sum(ndcg_at(top10.get(q, []), rel) for q, rel in qrels.items()) / n, 4),
        f"recall@{depth}": round(sum(recall_at(rankings.get(q, []), rel, depth) for q, rel in qrels.items()) / n, 4),
    }


def postgres_fts(database_url: str, docs: list[dict], queries: dict, qrels: dict) -> dict:
    """The alternative a user would pick: tsvector, GIN, ts_rank_cd, OR of the query's lexemes."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_fts")
        conn.execute("CREATE TABLE bench_fts (id text PRIMARY KEY, tsv tsvector)")
        with conn.cursor().copy("COPY bench_fts (id, tsv) FROM STDIN") as copy:
            for d in docs:
                copy.write_row((d["_id"], None))
        conn.execute("UPDATE bench_fts f SET tsv = to_tsvector('english', x.title || ' ' || x.text) FROM"
                     " (SELECT * FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(id, title, text)) x"
                     " WHERE f.id = x.id", ([d["_id"] for d in docs], [d["title"] for d in docs],
                                            [d["text"] for d in docs]))
        conn.execute("CREATE INDEX ON bench_fts USING gin (tsv)")
        conn.execute("ANALYZE bench_fts")
        sql = ("WITH q AS (SELECT to_tsquery('english', coalesce(nullif(array_to_string("
               "tsvector_to_array(to_tsvector('english', %s)), ' | '), ''), 'x')) AS q)"
               " SELECT id FROM bench_fts, q WHERE tsv @@ q.q ORDER BY ts_rank_cd(tsv, q.q) DESC LIMIT %s")
        rankings, latencies = {}, []
        for qid, text in queries.items():
            t = time.perf_counter()
            rankings[qid] = [r[0] for r in conn.execute(sql, (text, API_MAX_LIMIT)).fetchall()]
            latencies.append((time.perf_counter() - t) * 1000)
        conn.execute("DROP TABLE bench_fts")
    return {**score(rankings, qrels), "latency_c1": latency_summary(latencies)}


async def freshness(client, seconds: float, rate: float) -> dict:
    """202 -> searchable under a steady ingest of `rate` records/s (batches of 10 every 10/rate s):
    one Receipt per batch is polled from the moment its 202 arrived until it reads searchable."""
    samples: list[float] = []
    pending: dict[str, float] = {}
    stop = time.perf_counter() + seconds
    sent = 0
    batch = 10

    async def poll():
        while pending or time.perf_counter() < stop:
            for rid, t0 in list(pending.items()):
                r = await client.get(f"/v0/ingestion-receipts/{rid}")
                if r.status_code == 200 and (r.json().get("availability") or {}).get("searchable"):
                    samples.append((time.perf_counter() - t0) * 1000)
                    del pending[rid]
            await asyncio.sleep(0.02)
            if time.perf_counter() > stop + 60:
                return

    async def send(first: int):
        entries = [{"idempotency_key": f"fresh-{first + i}-{time.time_ns()}",
                    "source": {"corpus_id": "freshness", "namespace": "f", "record_key": f"f{first + i}"},
                    "content": {"kind": "text", "text": f"freshness probe {first + i} about protein folding"}}
                   for i in range(batch)]
        r = await client.post("/v0/records/batch", json={"entries": entries})
        if r.status_code == 200:
            pending[r.json()["items"][0]["receipt"]["receipt_id"]] = time.perf_counter()

    poller = asyncio.create_task(poll())
    interval = batch / rate
    next_at = time.perf_counter()
    tasks = []
    while time.perf_counter() < stop:
        tasks.append(asyncio.create_task(send(sent)))
        sent += batch
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    await asyncio.gather(*tasks)
    await poller
    return {"rate_per_s": rate, "sent": sent, "sampled": len(samples), "unresolved": len(pending),
            **{k: v for k, v in latency_summary(samples).items() if k != "mean_ms"}}


def current_texts(conn: psycopg.Connection) -> list[str]:
    """The text of every current Version (its text Parts, in manifest order), as the replay indexes it."""
    rows = conn.execute("SELECT v.manifest FROM versions v JOIN records r ON r.current_version_id = v.version_id"
                        " WHERE NOT r.withdrawn").fetchall()
    return ["\n".join(p["content"]["text"] for p in manifest["parts"] if p["content"].get("kind") == "text")
            for (manifest,) in rows]


def raw_query(index: tantivy.Index, text: str) -> tantivy.Query | None:
    """A natural query for raw Tantivy: its words, punctuation dropped, OR'ed over `text`."""
    words = re.sub(r"[^\w\s]+", " ", text.lower()).split()
    return index.parse_query(" ".join(words), ["text"]) if words else None


def raw_tantivy(texts: list[str], queries: list[str]) -> dict:
    """The ceilings of the replay and of a lexical search, measured in the same run: Tantivy alone
    indexing the same texts (one document each, one en_stem field) with the replay's writer
    threads and heap, committed to disk; then answering the same queries (top 10, in this process,
    no HTTP, no filters, no excerpts)."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("text", tokenizer_name="en_stem")
    folder = tempfile.mkdtemp(prefix="contentsvc-bench-raw-tantivy-")
    try:
        index = tantivy.Index(builder.build(), path=folder)
        threads = os.cpu_count() or 1
        started = time.perf_counter()
        writer = index.writer(heap_size=WRITER_HEAP_PER_THREAD * threads, num_threads=threads)
        for text in texts:
            writer.add_document(tantivy.Document(text=text))
        writer.commit()
        writer.wait_merging_threads()
        seconds = time.perf_counter() - started
        index.reload()
        searcher, latencies = index.searcher(), []
        for text in queries:
            began = time.perf_counter()
            if (query := raw_query(index, text)) is not None:
                searcher.search(query, 10, count=False)
            latencies.append((time.perf_counter() - began) * 1000)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"docs": len(texts), "seconds": round(seconds, 2), "docs_per_s": round(len(texts) / seconds, 1),
            "query_latency": latency_summary(latencies)}


async def http_floor(load: LoadClient, requests: int) -> dict:
    """The HTTP stack's own share of a search's latency, measured in the same run: an authenticated
    GET of the search profiles (no database, no index) through the same client, one at a time."""
    latencies = []
    for _ in range(requests):
        began = time.perf_counter()
        answer = await load.get("/v0/search/profiles")
        latencies.append((time.perf_counter() - began) * 1000)
        if answer.status_code != 200:
            raise BenchError(f"listSearchProfiles: {answer.status_code} {answer.text[:300]}")
    return latency_summary(latencies)


async def replay_rate(database_url: str, home: str, cap_s: float, queries: list[str]) -> dict:
    """`projector replay lexical` in this process: fold from position 0 and cut over, timed, and
    its raw ceiling. Both on a quiet service: every fold has caught up first (when the freshness
    phase ends its Records are still being indexed and embedded, which took the cores the replay
    was timed on)."""
    from contentsvc.operator.replay import replay_lexical

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await folds_caught_up(conn, cap_s)
    with psycopg.connect(database_url, autocommit=True) as conn:
        texts = current_texts(conn)
    raw = raw_tantivy(texts, queries)
    started = time.perf_counter()
    await replay_lexical(database_url, Path(home))
    seconds = time.perf_counter() - started
    rate = len(texts) / seconds
    return {"parts": len(texts), "seconds": round(seconds, 2), "parts_per_s": round(rate, 1),
            "raw_tantivy": raw, "ratio_to_raw": round(rate / raw["docs_per_s"], 3),
            "note": "fold from position 0, index commit and cutover; process start-up excluded"}


async def long_versions(target, docs: list[dict], queries: dict[str, str], cap_s: float) -> dict:
    """Lexical latency (c=1, 10 hits) of the SciFact queries over LONG_VERSIONS Versions of
    LONG_ABSTRACTS abstracts each: every hit's excerpt is cut from a segment of a long text."""
    long_docs = [{"_id": f"long{i}", "title": "", "text": "\n\n".join(
        f"{d['title']}. {d['text']}" for d in docs[i * LONG_ABSTRACTS:(i + 1) * LONG_ABSTRACTS])}
        for i in range(LONG_VERSIONS)]
    async with api_client(target, timeout=60) as client:
        await create_corpus(client, LONG_CORPUS, LONG_CORPUS)
        await ingest_all(client, long_docs, LONG_CORPUS)  # one batch of 20: about 7.5 MB
    # Searchable first: the folds' checkpoints can pass the accepted commands before the
    # materializer has appended the Versions they fold. Then embedded too, for a quiet service.
    from contentsvc.storage import database  # noqa: F401 - jsonb through msgspec, as the service reads it

    deadline = time.perf_counter() + cap_s
    with psycopg.connect(target.database_url, autocommit=True) as conn:
        while len(versions := [v for v, in conn.execute(
                "SELECT version_id FROM versions WHERE corpus_id = %s AND searchable", (LONG_CORPUS,))]) < LONG_VERSIONS:
            if time.perf_counter() > deadline:
                raise BenchError(f"the long Versions were not all searchable after {cap_s} s")
            time.sleep(0.5)
    async with await psycopg.AsyncConnection.connect(target.database_url, autocommit=True) as conn:
        await folds_caught_up(conn, cap_s)
    with psycopg.connect(target.database_url, autocommit=True) as conn:
        id_of = dict(conn.execute("SELECT record_id, record_key FROM records WHERE corpus_id = %s",
                                  (LONG_CORPUS,)).fetchall())
        # The reference: reading and decoding the manifests of a page of 10 such Versions, which
        # a search whose index stores no segment texts does to cut its excerpts.
        manifest_reads = []
        for i in range(30):
            page = [versions[(i + k) % len(versions)] for k in range(10)]
            t = time.perf_counter()
            conn.execute("SELECT manifest FROM versions WHERE version_id = ANY(%s)", (page,)).fetchall()
            manifest_reads.append((time.perf_counter() - t) * 1000)
    load = LoadClient(target.base_url, target.api_key, 1)
    await run_queries(load, dict(list(queries.items())[:10]), "lexical", 1, id_of, corpus=LONG_CORPUS)  # warm up
    _, latencies, errors, _ = await run_queries(load, queries, "lexical", 1, id_of, limit=10, corpus=LONG_CORPUS)
    await load.aclose()
    return {"versions": LONG_VERSIONS, "mean_chars": round(sum(len(d["text"]) for d in long_docs) / LONG_VERSIONS),
            "errors": errors,
            "lexical_latency_c1": latency_summary(latencies),
            "reference_manifests_of_10_read_ms": latency_summary(manifest_reads)}


async def run(args, clock: Run) -> dict:
    docs, queries, qrels = load_dataset(Path(args.dataset))
    home = tempfile.mkdtemp(prefix="contentsvc-bench-search-")
    service = OwnService(SERVER_LOG)
    report: dict = {"suite": "search", "dataset": str(args.dataset), "queries": len(queries), "docs": len(docs)}
    try:
        target = service.start(home=Path(home))
        async with api_client(target, timeout=60) as client:
            for corpus in (CORPUS, "freshness"):
                await create_corpus(client, corpus, corpus)
            say("ingesting ...")
            ingest_s = await ingest_all(client, docs)
            ready = wait_ready(target.database_url, len(docs), args.cap)
            report["ingest"] = {"seconds": round(ingest_s, 1), **ready,
                                "planner_statistics": planner_statistics(target.database_url)}
            with psycopg.connect(target.database_url) as conn:
                id_of = dict(conn.execute("SELECT record_id, record_key FROM records WHERE corpus_id = %s",
                                          (CORPUS,)).fetchall())
            report["modes"] = {}
            load = LoadClient(target.base_url, target.api_key, 8)
            for mode in MODES:
                say(f"{mode} ...")
                await run_queries(load, dict(list(queries.items())[:10]), mode, 1, id_of)  # warm up
                # Relevance with the API's largest page; latency with the default page (10 hits).
                rankings, _, errors, _ = await run_queries(load, queries, mode, 1, id_of)
                _, lat1, errors1, _ = await run_queries(load, queries, mode, 1, id_of, limit=10)
                _, lat8, errors8, wall8 = await run_queries(load, queries, mode, 8, id_of, limit=10)
                report["modes"][mode] = {**score(rankings, qrels), "errors": errors + errors1 + errors8,
                                         "latency_c1": latency_summary(lat1), "latency_c8": latency_summary(lat8),
                                         "throughput_c8_qps": round(len(queries) / wall8, 1)}
            report["http_floor"] = await http_floor(load, len(queries))
            await load.aclose()
            report["query_client"] = "bench/http_load.py LoadClient: keep-alive HTTP/1.1, one request per connection"
            say("postgres full-text baseline ...")
            report["postgres_fts"] = postgres_fts(target.database_url, docs, queries, qrels)
            say("freshness ...")
            report["freshness"] = await freshness(client, args.fresh_seconds, args.fresh_rate)
        say("replay ...")
        report["replay"] = await replay_rate(target.database_url, home, args.cap, list(queries.values()))
        say("long Versions ...")
        report["long_versions"] = await long_versions(target, docs, queries, args.cap)
    finally:
        service.stop()
        shutil.rmtree(home, ignore_errors=True)  # the run's indexes: tens of MB a run
    lex, hyb = report["modes"]["lexical"], report["modes"]["hybrid"]
    fts = report["postgres_fts"]
    report["ratios"] = {
        "lexical_ndcg_vs_postgres_fts": round(lex["ndcg@10"] / fts["ndcg@10"], 3) if fts["ndcg@10"] else None,
        "lexical_p50_vs_postgres_fts_p50": round(lex["latency_c1"]["p50_ms"] / fts["latency_c1"]["p50_ms"], 2),
        # What of a search's p50 is neither HTTP nor the engine: reading, authorizing, excerpting.
        "lexical_p50_minus_http_floor_ms": round(lex["latency_c1"]["p50_ms"] - report["http_floor"]["p50_ms"], 2),
        "raw_tantivy_query_p50_ms": report["replay"]["raw_tantivy"]["query_latency"]["p50_ms"],
    }
    report["targets"] = judge(TARGETS, {
        "lexical_ndcg10_vs_published_bm25": lex["ndcg@10"],
        "lexical_p50_ms": lex["latency_c1"]["p50_ms"],
        "hybrid_p50_ms": hyb["latency_c1"]["p50_ms"],
        "freshness_p50_ms": report["freshness"]["p50_ms"],
        "replay_parts_per_s": report["replay"]["parts_per_s"],
    })
    clock.finish()
    report["machine"] = clock.machine
    report["timestamp"] = clock.timestamp
    return report


def summary(report: dict) -> str:
    lines = [f"contentsvc bench search  {report['timestamp']}  {machine_line(report['machine'])}",
             f"SciFact: {report['docs']} docs, {report['queries']} test queries"]
    lines.append(f"ingest {report['ingest']}")
    for mode, m in report["modes"].items():
        lines.append(f"{mode:9s} nDCG@10 {m['ndcg@10']:.4f}  recall@{API_MAX_LIMIT} {m[f'recall@{API_MAX_LIMIT}']:.4f}"
                     f"  c=1 p50 {m['latency_c1']['p50_ms']} p99 {m['latency_c1']['p99_ms']} ms"
                     f"  c=8 p50 {m['latency_c8']['p50_ms']} p99 {m['latency_c8']['p99_ms']} ms"
                     f"  ({m['throughput_c8_qps']} q/s)  errors {m['errors']}")
    f = report["postgres_fts"]
    lines.append(f"pg fts    nDCG@10 {f['ndcg@10']:.4f}  recall@{API_MAX_LIMIT} {f[f'recall@{API_MAX_LIMIT}']:.4f}"
                 f"  c=1 p50 {f['latency_c1']['p50_ms']} p99 {f['latency_c1']['p99_ms']} ms (SQL, no HTTP)")
    lines.append(f"http floor (GET /v0/search/profiles, c=1) p50 {report['http_floor']['p50_ms']}"
                 f" p99 {report['http_floor']['p99_ms']} ms")
    lines.append(f"ratios    {report['ratios']}")
    lines.append(f"freshness {report['freshness']}")
    lines.append(f"replay    {report['replay']}")
    lines.append(f"long      {report['long_versions']}")
    return "\n".join(lines + target_lines(report) + closing_lines(report, RESULT_PATH))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="contentsvc bench search")
    parser.add_argument("--dataset", default=str(DATASET))
    parser.add_argument("--cap", type=float, default=1800, help="seconds to wait for embeddings at most")
    parser.add_argument("--fresh-seconds", type=float, default=15)
    parser.add_argument("--fresh-rate", type=float, default=200)
    args = parser.parse_args(argv)
    if min(args.cap, args.fresh_seconds, args.fresh_rate) <= 0:
        parser.error("--cap, --fresh-seconds and --fresh-rate are positive")
    try:
        report = asyncio.run(run(args, Run()))
    except BenchError as exc:
        print(f"bench search failed: {exc}", file=sys.stderr)
        return 1
    write_results(RESULT_PATH, report)
    print(summary(report))
    return 0
