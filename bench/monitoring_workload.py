"""What `contentsvc bench monitoring` monitors: the deployment folder (the `query` evaluator launched
by `contentsvc run`, one destination at the bench's receiver), SciFact documents, and the Saved
Queries and Subscriptions over them.

Expressions are drawn from SciFact's own vocabulary by document frequency, so that a realistic
share of (Version, Subscription) pairs match (about 1 to 2 %): single terms of 1-3 % of the
documents, AND pairs of 3-8 % terms, OR pairs of 0.5-1 % terms, and a common term AND a 1-3 %
one. The first `distinct` Subscriptions take one expression each; the rest repeat them with a
Zipf-like skew (a few popular queries shared by many), so deduplication matters: each Version is
`distinct` evaluations for `subscriptions` decisions.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from contentsvc.bench.driver import BenchError
from contentsvc.processes.local_service import free_port
from contentsvc_plugins.query.plugin import FOLDER as QUERY_FOLDER

DESTINATION = "bench"
QUERY_VERSION = "0.1.0"
SEED = 7
WORD = re.compile(r"[a-z]{5,}")
BANDS = {"rare": (0.005, 0.01), "mid": (0.01, 0.03), "common": (0.03, 0.08), "frequent": (0.08, 0.2)}
CREATE_CONCURRENCY = 8


def load_documents(path: Path) -> list[dict[str, str]]:
    """SciFact's corpus.jsonl as bench/search.py reads it: `_id`, `title`, `text`."""
    try:
        docs = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    except FileNotFoundError:
        raise BenchError(f"no {path} (give the SciFact folder with --dataset)") from None
    if not docs:
        raise BenchError(f"no documents in {path}")
    return docs


def text_of(doc: dict[str, str]) -> str:
    return doc["text"] or doc["title"] or "-"


def deploy(folder: Path, receiver_url: str, secret: str) -> Path:
    """contentsvc.toml launching the `query` evaluator, with the bench's receiver as the one destination."""
    (folder / "query").mkdir(parents=True, exist_ok=True)
    shutil.copy(QUERY_FOLDER / "contentsvc-plugin.json", folder / "query")
    config = folder / "contentsvc.toml"
    config.write_text(
        f'[plugins.query]\nendpoint = "http://127.0.0.1:{free_port()}"\nversion = "{QUERY_VERSION}"\n'
        'manifest = "query/contentsvc-plugin.json"\nlaunch = "query"\n\n'
        f'[destinations.{DESTINATION}]\nurl = "{receiver_url}"\nsecret = "{secret}"\n')
    return config


def vocabulary(docs: list[dict[str, str]]) -> dict[str, list[str]]:
    """Words of five letters or more by the share of documents holding them, in a fixed order."""
    df: Counter[str] = Counter()
    for d in docs:
        df.update(set(WORD.findall(f"{d['title']} {d['text']}".lower())))
    n = len(docs)
    return {band: sorted(w for w, c in df.items() if lo * n <= c < hi * n) for band, (lo, hi) in BANDS.items()}


def expressions(docs: list[dict[str, str]], distinct: int) -> list[dict[str, Any]]:
    words = vocabulary(docs)
    rng = random.Random(SEED)
    shapes = [
        (0.40, lambda: rng.choice(words["mid"])),
        (0.25, lambda: f"{rng.choice(words['common'])} AND {rng.choice(words['common'])}"),
        (0.20, lambda: f"{rng.choice(words['rare'])} OR {rng.choice(words['rare'])}"),
        (0.15, lambda: f"{rng.choice(words['frequent'])} AND {rng.choice(words['mid'])}"),
    ]
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(out) < distinct:
        pick, acc = rng.random(), 0.0
        for share, make in shapes:
            acc += share
            if pick < acc:
                break
        query = make()
        if query not in seen:
            seen.add(query)
            out.append({"query": query})
    return out


def assignment(distinct: int, subscriptions: int) -> list[int]:
    """Which expression each Subscription takes: every one once, the rest skewed (weight 1/rank)."""
    rng = random.Random(SEED + 1)
    first = list(range(min(distinct, subscriptions)))
    weights = [1.0 / (rank + 1) for rank in range(distinct)]
    return first + rng.choices(range(distinct), weights=weights, k=subscriptions - len(first))


async def subscribe_all(client: httpx.AsyncClient, corpus_ids: list[str], exprs: list[dict[str, Any]],
                        subscriptions: int) -> dict[str, Any]:
    """One Saved Query per distinct expression; `subscriptions` Subscriptions over them (owners vary)."""
    gate = asyncio.Semaphore(CREATE_CONCURRENCY)

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            r = await client.post(path, json={"idempotency_key": uuid.uuid4().hex, **body})
        if r.status_code != 201:
            raise BenchError(f"POST {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    queries = await asyncio.gather(*(post("/v0/saved-queries", {"name": f"q{n}", "corpus_ids": corpus_ids,
                                                                 "expression": e})
                                     for n, e in enumerate(exprs)))
    chosen = assignment(len(exprs), subscriptions)
    evaluator = {"plugin_id": "query", "version": QUERY_VERSION, "configuration": {}}
    await asyncio.gather(*(post("/v0/subscriptions", {
        "name": f"s{n}", "saved_query_version_id": queries[q]["current_version_id"], "evaluator": evaluator,
        "destination_id": DESTINATION, "owner": f"user-{n % 97}"}) for n, q in enumerate(chosen)))
    shared = Counter(chosen)
    return {"subscriptions": subscriptions, "distinct_expressions": len(exprs),
            "dedup_ratio": round(subscriptions / len(exprs), 2),
            "most_shared_expression_subscriptions": max(shared.values()),
            "expression_shapes": dict(Counter(_shape(e["query"]) for e in exprs)),
            "examples": [e["query"] for e in exprs[:6]]}


def _shape(query: str) -> str:
    return "a AND b" if " AND " in query else "a OR b" if " OR " in query else "term"
