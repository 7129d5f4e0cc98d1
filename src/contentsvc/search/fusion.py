"""Hybrid fusion: one ranking from the lexical and the semantic candidates of a search.

Two methods, each a search profile's choice (docs/decisions.md "Hybrid fusion"):

* reciprocal-rank fusion: each list adds 1 / (k + rank); it ignores how far apart the scores are;
* a convex combination of z-scores: each list's scores are standardized over its own candidates
  (a candidate missing from a list gets that list's lowest z-score) and weighed. BM25 and cosine
  live on unrelated scales; standardizing per query makes the weight mean the same in every query,
  and unlike ranks it keeps how far ahead a clear winner is.

A Version is cited by the segment of the first list that holds it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class Scored(Protocol):
    version_id: str
    score: float


@dataclass(frozen=True)
class Fusion:
    method: str  # "rrf" | "zscore"
    rrf_k: int = 10
    lexical_weight: float = 0.5

    def fuse(self, lexical: list, semantic: list) -> list[tuple[Scored, float]]:
        scores = (_rrf(self.rrf_k, lexical, semantic) if self.method == "rrf"
                  else _zscore(self.lexical_weight, lexical, semantic))
        first: dict[str, Scored] = {}
        for r in (*lexical, *semantic):
            first.setdefault(r.version_id, r)
        # Sorted from the lists' own order (the lexical list's first): a tie keeps it, the same in
        # every process. Sorting the scores' keys tied by set order, which string hashing randomizes
        # per process: two Versions that swap places between the lists tie exactly under z-scores
        # at equal weights, and a search answered one order or the other after a restart.
        return [(first[v], scores[v]) for v in sorted(first, key=lambda v: -scores[v])]


def _rrf(k: int, *rankings: list[Scored]) -> dict[str, float]:
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, r in enumerate(ranking, start=1):
            scores[r.version_id] = scores.get(r.version_id, 0.0) + 1.0 / (k + rank)
    return scores


def _standardized(ranking: list[Scored]) -> dict[str, float]:
    best: dict[str, float] = {}
    for r in ranking:  # a Version's first (best) score when a list holds it twice
        best.setdefault(r.version_id, r.score)
    if not best:
        return {}
    mean = sum(best.values()) / len(best)
    spread = math.sqrt(sum((s - mean) ** 2 for s in best.values()) / len(best)) or 1.0
    return {v: (s - mean) / spread for v, s in best.items()}


def _zscore(lexical_weight: float, lexical: list[Scored], semantic: list[Scored]) -> dict[str, float]:
    lex, sem = _standardized(lexical), _standardized(semantic)
    if not lex or not sem:  # one list alone: its own order
        return lex or sem
    lex_floor, sem_floor = min(lex.values()), min(sem.values())
    return {v: lexical_weight * lex.get(v, lex_floor) + (1 - lexical_weight) * sem.get(v, sem_floor)
            for v in lex.keys() | sem.keys()}
