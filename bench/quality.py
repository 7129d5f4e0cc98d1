"""`contentsvc bench quality`: relevance per mode on SciFact and Cranfield, through the HTTP API.

Both collections are ingested into one service this suite starts; every test query is sent
in lexical, semantic and hybrid mode (hybrid under the `default` profile's z-score fusion and
the `rrf` profile's reciprocal-rank fusion). Beside them, in the same run:

* the raw engine: Tantivy in this process with its `en_stem` analyzer, title and text in one
  field, the reference the lexical mode is compared with;
* the fusion choice, checked without looking at the queries it is reported on: each candidate
  fusion is scored offline on the lexical and semantic lists the API answered (the 30 candidates
  a search of 10 hits fuses), chosen on one half of a collection's queries and reported on the
  other half (two folds, both ways), and chosen on Cranfield and reported on SciFact.

nDCG@10 of a search of 10 hits, and recall at the API's largest page (50 hits; the raw engine also
gives recall@100).
Writes bench/results/quality.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import tantivy

from contentsvc.bench.driver import (DATASETS, RESULTS_DIR, BenchError, Progress, Run, closing_lines, judge,
                                     machine_line, target_lines, teller, write_results)
from contentsvc.bench.search import API_MAX_LIMIT, ingest_all, load_dataset, ndcg_at, raw_query, score
from contentsvc.bench.service import OwnService, api_client, create_corpus
from contentsvc.search.fusion import Fusion
from contentsvc.search.service import FUSIONS

say = teller("quality")

RESULT_PATH = RESULTS_DIR / "quality.json"
SERVER_LOG = RESULTS_DIR / "quality-server.log"
COLLECTIONS = ("scifact", "cranfield")
FUSED_CANDIDATES = 30  # a search of 10 hits fuses 2 x 10 + 10 candidates of each list
CANDIDATE_FUSIONS = [Fusion("rrf", rrf_k=k) for k in (5, 10, 20, 40, 60)] + [
    Fusion("zscore", lexical_weight=w / 20) for w in range(6, 15)]
SPLIT_SEED = 20261124
TARGETS = {"scifact_lexical_ndcg10": {"op": ">=", "value": 0.684, "unit": "nDCG@10"},
           "scifact_hybrid_ndcg10": {"op": ">=", "value": 0.720, "unit": "nDCG@10"}}


@dataclass(frozen=True)
class Listed:
    version_id: str
    score: float


def wait_enriched(database_url: str, expected: dict[str, int], cap_s: float) -> float:
    started, progress = time.perf_counter(), Progress("quality")
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.perf_counter() - started < cap_s:
            counts = dict(conn.execute("SELECT corpus_id, count(*) FILTER (WHERE enriched) FROM versions"
                                       " GROUP BY corpus_id").fetchall())
            progress.show(f"enriched {counts}")
            if all(counts.get(c, 0) >= n for c, n in expected.items()):
                progress.done()
                return round(time.perf_counter() - started, 1)
            time.sleep(2.0)
    raise BenchError(f"not every Version was embedded within {cap_s} s")


async def search_all(client, corpus: str, queries: dict[str, str], mode: str, profile: str,
                     key_of: dict[str, str], limit: int) -> dict[str, list[Listed]]:
    """Each query's hits (record keys, with the explanation's score)."""
    out: dict[str, list[Listed]] = {}
    sem = asyncio.Semaphore(4)

    async def one(qid: str, text: str):
        async with sem:
            r = await client.post("/v0/search", json={"query": text[:8192], "corpus_ids": [corpus], "mode": mode,
                                                     "profile": profile, "limit": limit})
            if r.status_code != 200:
                raise BenchError(f"{mode} search answered {r.status_code}: {r.text[:300]}")
            out[qid] = [Listed(key_of[h["record_id"]], h["explanation"]["score"]) for h in r.json()["items"]]

    await asyncio.gather(*(one(q, t) for q, t in queries.items()))
    return out


def keys(answered: dict[str, list[Listed]]) -> dict[str, list[str]]:
    return {q: [r.version_id for r in hits] for q, hits in answered.items()}


def raw_engine(docs: list[dict], queries: dict[str, str], qrels: dict) -> dict:
    """Tantivy's own en_stem analyzer, title and text in one field, BM25: no service around it."""
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("id", stored=True, tokenizer_name="raw")
    builder.add_text_field("text", tokenizer_name="en_stem")
    index = tantivy.Index(builder.build())
    writer = index.writer()
    for d in docs:
        writer.add_document(tantivy.Document(id=d["_id"], text=f"{d['title']}\n{d['text']}"))
    writer.commit()
    index.reload()
    searcher = index.searcher()
    rankings = {}
    for qid in qrels:
        query = raw_query(index, queries[qid])
        hits = searcher.search(query, 100).hits if query is not None else []
        rankings[qid] = [searcher.doc(address)["id"][0] for _, address in hits]
    return {**score(rankings, qrels), **score(rankings, qrels, 100)}


def fused_ndcg(fusion: Fusion, lists: dict, qrels: dict, qids: list[str]) -> float:
    total = 0.0
    for q in qids:
        lexical, semantic = (ranking[:FUSED_CANDIDATES] for ranking in lists[q])
        total += ndcg_at([r.version_id for r, _ in fusion.fuse(lexical, semantic)], qrels[q])
    return total / len(qids)


def describe(fusion: Fusion) -> str:
    return f"rrf k={fusion.rrf_k}" if fusion.method == "rrf" else f"zscore lexical_weight={fusion.lexical_weight}"


def fusion_choice(lists: dict[str, dict], qrels: dict[str, dict]) -> dict:
    """Two-fold cross-validation per collection, and Cranfield -> SciFact."""
    out: dict = {"candidates": {c: {describe(f): round(fused_ndcg(f, lists[c], qrels[c], sorted(qrels[c])), 4)
                                    for f in CANDIDATE_FUSIONS} for c in COLLECTIONS}}
    for c in COLLECTIONS:
        qids = sorted(qrels[c])
        random.Random(SPLIT_SEED).shuffle(qids)
        halves = (qids[:len(qids) // 2], qids[len(qids) // 2:])
        folds = []
        for train, test in (halves, halves[::-1]):
            for method in ("rrf", "zscore"):
                best = max((f for f in CANDIDATE_FUSIONS if f.method == method),
                           key=lambda f: fused_ndcg(f, lists[c], qrels[c], train))
                folds.append({"method": method, "chosen": describe(best),
                              "held_out_ndcg@10": round(fused_ndcg(best, lists[c], qrels[c], test), 4)})
        out[f"{c}_two_fold"] = {
            "folds": folds,
            **{f"{method}_held_out_mean": round(sum(f["held_out_ndcg@10"] for f in folds if f["method"] == method)
                                                / 2, 4) for method in ("rrf", "zscore")}}
    best_on_cranfield = max(CANDIDATE_FUSIONS, key=lambda f: fused_ndcg(f, lists["cranfield"], qrels["cranfield"],
                                                                         sorted(qrels["cranfield"])))
    out["tuned_on_cranfield"] = {"chosen": describe(best_on_cranfield), "scifact_ndcg@10": round(
        fused_ndcg(best_on_cranfield, lists["scifact"], qrels["scifact"], sorted(qrels["scifact"])), 4)}
    out["served"] = {profile: describe(fusion) for profile, fusion in FUSIONS.items()}
    return out


async def run(args, clock: Run) -> dict:
    data = {c: load_dataset(DATASETS / c) for c in COLLECTIONS}
    home = tempfile.mkdtemp(prefix="contentsvc-bench-quality-")
    service = OwnService(SERVER_LOG)
    report: dict = {"suite": "quality", "collections": {c: {"docs": len(data[c][0]), "queries": len(data[c][1])}
                                                        for c in COLLECTIONS}}
    try:
        target = service.start(home=Path(home))
        async with api_client(target, timeout=120) as client:
            for c in COLLECTIONS:
                await create_corpus(client, c, c)
                say(f"ingesting {c} ...")
                await ingest_all(client, data[c][0], c)
            report["embedded_after_s"] = wait_enriched(target.database_url,
                                                       {c: len(data[c][0]) for c in COLLECTIONS}, args.cap)
            with psycopg.connect(target.database_url) as conn:
                key_of = dict(conn.execute("SELECT record_id, record_key FROM records").fetchall())
            lists: dict[str, dict] = {}
            for c in COLLECTIONS:
                _, queries, qrels = data[c]
                modes = {}
                answered = {}
                for mode, profile in (("lexical", "default"), ("semantic", "default"), ("hybrid", "default"),
                                      ("hybrid", "rrf")):
                    say(f"{c} {mode} ({profile}) ...")
                    # A search of 10 hits for nDCG@10 (hybrid fuses as many candidates as a limit asks
                    # for), the API's largest page for recall.
                    answered[mode, profile] = await search_all(client, c, queries, mode, profile, key_of,
                                                               API_MAX_LIMIT)
                    top10 = await search_all(client, c, queries, mode, profile, key_of, 10)
                    name = mode if profile == "default" else f"{mode}_{profile}"
                    modes[name] = score(keys(answered[mode, profile]), qrels, top10=keys(top10))
                lists[c] = {q: (answered["lexical", "default"].get(q, []), answered["semantic", "default"].get(q, []))
                            for q in qrels}
                say(f"{c} raw engine ...")
                report["collections"][c].update(modes=modes, raw_engine=raw_engine(*data[c]))
    finally:
        service.stop()
        shutil.rmtree(home, ignore_errors=True)  # the run's indexes
    report["fusion_choice"] = fusion_choice(lists, {c: data[c][2] for c in COLLECTIONS})
    scifact = report["collections"]["scifact"]["modes"]
    measured = {"scifact_lexical_ndcg10": scifact["lexical"]["ndcg@10"],
                "scifact_hybrid_ndcg10": scifact["hybrid"]["ndcg@10"]}
    report["targets"] = judge(TARGETS, measured)
    clock.finish()
    report["machine"] = clock.machine
    report["timestamp"] = clock.timestamp
    return report


def summary(report: dict) -> str:
    lines = [f"contentsvc bench quality  {report['timestamp']}  {machine_line(report['machine'])}",
             "through the HTTP API; the raw engine in process"]
    for c, found in report["collections"].items():
        lines.append(f"{c}: {found['docs']} docs, {found['queries']} judged queries")
        for mode, m in [*found["modes"].items(), ("raw engine", found["raw_engine"])]:
            lines.append(f"  {mode:12s} " + "  ".join(f"{k} {v:.4f}" for k, v in m.items()))
    choice = report["fusion_choice"]
    for c in COLLECTIONS:
        cv = choice[f"{c}_two_fold"]
        lines.append(f"fusion, {c} two folds held out: rrf {cv['rrf_held_out_mean']}  zscore {cv['zscore_held_out_mean']}"
                     f"  ({', '.join(f['chosen'] for f in cv['folds'])})")
    lines.append(f"fusion tuned on cranfield: {choice['tuned_on_cranfield']}")
    lines.append(f"served: {choice['served']}")
    return "\n".join(lines + target_lines(report) + closing_lines(report, RESULT_PATH))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="contentsvc bench quality")
    parser.add_argument("--cap", type=float, default=1800, help="seconds to wait for embeddings at most")
    args = parser.parse_args(argv)
    if args.cap <= 0:
        parser.error("--cap is positive")
    try:
        report = asyncio.run(run(args, Run()))
    except BenchError as exc:
        print(f"bench quality failed: {exc}", file=sys.stderr)
        return 1
    write_results(RESULT_PATH, report)
    print(summary(report))
    return 0
