"""`contentsvc bench embeddings`: how fast the engine's MiniLM space embeds, and how close the
default int8 encoder stays to float32.

Usage:
    contentsvc bench embeddings [--texts 500] [--queries 200]

In this process, no service: the encoder is what the vectors projector and the API's query
embedder run (`search/embedding.py`). For each precision, float32 (the reference: the
vectors sentence-transformers gives, to cosine 0.999) and int8 (the default):

  1. build the embedder (the encoder's graph from the model's weights; int8 calibrates too),
     timed;
  2. embed the first --texts SciFact abstracts (title and abstract, as one text), after a
     warm-up of four, with one thread per core as the vectors projector does: texts per second;
  3. embed --queries SciFact test queries one at a time with one thread, as the API does:
     p50 and p99 milliseconds.

Then the cosine of each int8 vector to its float32 one (least, 1st percentile, mean).
Targets: int8 at least 30 texts/s, twice the 8-15 texts/s the numpy encoder was measured at
when this target was set; its least cosine to float32 at least 0.99, the bound within which
the vectors stay in the same space version. Figures go to bench/results/embeddings.json.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from contentsvc.bench.driver import (DATASETS, RESULTS_DIR, Run, closing_lines, judge, machine_line,
                                     target_lines, write_results)
from contentsvc.bench.search import load_dataset
from contentsvc.bench.stats import latency_summary
from contentsvc.search.embedding import MiniLMEmbedder

RESULT_PATH = RESULTS_DIR / "embeddings.json"
SCIFACT = DATASETS / "scifact"
TARGETS = {
    "int8_texts_per_s": {"op": ">=", "value": 30.0, "unit": "texts/s"},
    "int8_cosine_min": {"op": ">=", "value": 0.99, "unit": "cosine"},
}


def measure(precision: str, texts: list[str], queries: list[str]) -> tuple[dict, np.ndarray]:
    started = time.perf_counter()
    embedder = MiniLMEmbedder(precision=precision)
    built_s = time.perf_counter() - started
    embedder.embed(texts[:4])
    started = time.perf_counter()
    vectors = embedder.embed(texts)
    seconds = time.perf_counter() - started
    query_embedder = MiniLMEmbedder(precision=precision, threads=1)
    latencies = []
    for query in queries:
        started = time.perf_counter()
        query_embedder.embed_query(query)
        latencies.append((time.perf_counter() - started) * 1000)
    return {
        "build_s": round(built_s, 2),
        "texts": len(texts),
        "seconds": round(seconds, 2),
        "texts_per_s": round(len(texts) / seconds, 1),
        "query_ms": latency_summary(latencies),
    }, vectors


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="contentsvc bench embeddings")
    parser.add_argument("--texts", type=int, default=500, help="SciFact abstracts to embed per precision")
    parser.add_argument("--queries", type=int, default=200, help="SciFact queries to embed one at a time")
    args = parser.parse_args(argv)
    if min(args.texts, args.queries) < 1:
        parser.error("--texts and --queries are at least 1")
    run = Run()
    docs, all_queries, _ = load_dataset(SCIFACT)
    texts = [f"{doc.get('title', '')}\n{doc['text']}" for doc in docs[:args.texts]]
    queries = list(all_queries.values())[:args.queries]
    float32, reference = measure("float32", texts, queries)
    int8, vectors = measure("int8", texts, queries)
    cosines = np.sum(vectors * reference, axis=1)
    agreement = {"min": round(float(cosines.min()), 5), "p1": round(float(np.percentile(cosines, 1)), 5),
                 "mean": round(float(cosines.mean()), 5)}
    run.finish()
    report = {
        **run.head("embeddings"),
        "parameters": {"texts": len(texts), "queries": len(queries), "dataset": str(SCIFACT),
                       "text": "title, newline, abstract; cut at the model's 256-token window"},
        "machine": run.machine,
        "targets": judge(TARGETS, {"int8_texts_per_s": int8["texts_per_s"], "int8_cosine_min": agreement["min"]}),
        "results": {"float32": float32, "int8": int8, "int8_to_float32_cosine": agreement,
                    "int8_speedup_over_float32": round(int8["texts_per_s"] / float32["texts_per_s"], 2)},
    }
    write_results(RESULT_PATH, report)
    print(f"embeddings {machine_line(run.machine)}")
    for name, figures in (("float32", float32), ("int8", int8)):
        print(f"  {name:<8} {figures['texts_per_s']:>6.1f} texts/s ({figures['texts']} in {figures['seconds']} s, "
              f"built in {figures['build_s']} s); query p50 {figures['query_ms']['p50_ms']} ms, "
              f"p99 {figures['query_ms']['p99_ms']} ms")
    print(f"  int8 to float32 cosine: least {agreement['min']}, 1st percentile {agreement['p1']}, "
          f"mean {agreement['mean']}")
    for line in target_lines(report) + closing_lines(report, RESULT_PATH):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
