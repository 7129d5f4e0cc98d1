"""Semantic candidates restricted to the search's scope before the top-k is taken (part 1 rule 20).

One hnswlib index holds every Organization's and Corpus's vectors. Asking it for
the nearest k and filtering afterwards starves a small Corpus beside large ones,
so the scope comes first: Postgres names the vectors a search may rank (its
Organization, its Corpora, the `source_namespaces` filter, current searchable
Versions only; readmodel/vectors, kept while the read model stands still by
search/semantic_scopes), and only those are ranked.

- Up to EXACT_SCAN_MAX vectors: an exact scan, the cosine of each with the query,
  over the scope's vectors read from Postgres by label (binary, about 5 us each; the
  hnswlib binding's get_items takes about 30 us each). Exact, and as fresh as
  Postgres: the loaded snapshot's lag does not matter.
- More: hnswlib's own filtered search (the filter callback admits only the
  scope's labels, so the graph walk returns the nearest allowed ones, in about a
  millisecond). Allowed labels newer than the loaded snapshot are scored from
  their stored vectors. If the walk returns fewer Versions than wanted, the
  exact scan answers instead.

Every filter of a search applies here, so `source_filter_unavailable` (part 1
rule 20) is never needed for the engine's space; a space that could not apply a
filter would have to answer it rather than fewer hits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import hnswlib
import numpy as np
from psycopg import AsyncConnection

from contentsvc.readmodel import vectors as current_vectors
from contentsvc.search.embedding import DIMENSIONS
from contentsvc.search.semantic_scopes import Scope

# Measured on the deployment's 2-core machine (docs/decisions.md, Search): reading and
# scanning 5,000 vectors takes about 27 ms, reading only their labels about 15 ms (the scope's
# joins), and the filtered walk about 1 ms at any size; below 2,000 the exact scan costs little.
EXACT_SCAN_MAX = 2_000
# Segments per Version the filtered walk is asked for, so that collapsing them to one
# per Version still leaves the Versions wanted (else the exact scan answers).
SEGMENTS_PER_VERSION = 4


@dataclass(frozen=True)
class ServedIndex:
    """A loaded hnswlib snapshot and the sorted labels it lists."""

    index: hnswlib.Index
    labels: np.ndarray

    @classmethod
    def of(cls, index: hnswlib.Index) -> "ServedIndex":
        return cls(index, np.sort(np.asarray(index.get_ids_list(), dtype=np.int64)))

    def holds(self, labels: np.ndarray) -> np.ndarray:
        """Which of `labels` the snapshot lists (a binary search each: the scope is usually
        far smaller than the index)."""
        if len(self.labels) == 0:
            return np.zeros(len(labels), dtype=bool)
        at = np.minimum(np.searchsorted(self.labels, labels), len(self.labels) - 1)
        return self.labels[at] == labels


async def nearest(conn: AsyncConnection, served: Callable[[], Awaitable[ServedIndex]], query: np.ndarray,
                  scope: Scope, versions: int) -> list[tuple[int, float]]:
    """The `versions` nearest Versions in scope, best first: each as (label of its nearest
    segment, cosine similarity). `served` loads the hnswlib snapshot, needed only for a
    scope too large to scan."""
    version_of, labels = scope.version_of, scope.labels
    if len(version_of) <= EXACT_SCAN_MAX:
        stored = await current_vectors.stored(conn, list(version_of))
        return _exact([(label, version_of[label], vector) for label, vector in stored], query, versions)

    snapshot = await served()
    in_snapshot = snapshot.holds(labels)
    found = await asyncio.to_thread(_walk, snapshot.index, query, labels[in_snapshot], versions * SEGMENTS_PER_VERSION)
    if found is not None:
        late = labels[~in_snapshot].tolist()  # embedded after the snapshot was taken
        if late:
            stored = await current_vectors.stored(conn, late)
            found = (np.concatenate([found[0], np.asarray([r[0] for r in stored], dtype=np.int64)]),
                     np.concatenate([found[1], _matrix(r[1] for r in stored) @ query]))
        best = _best_per_version(*found, version_of, versions)
        if len(best) >= min(versions, len(set(version_of.values()))):
            return best
    # The walk ran short of Versions (many segments each, or a sparse filter): rank them all.
    stored = await current_vectors.stored(conn, labels.tolist())
    return _exact([(label, version_of[label], vector) for label, vector in stored], query, versions)


def _matrix(raw_vectors) -> np.ndarray:
    """Stored vectors (float32, little-endian) as one (n, dimensions) matrix."""
    return np.frombuffer(b"".join(raw_vectors), dtype="<f4").reshape(-1, DIMENSIONS)


def _exact(rows: list[tuple[int, str, bytes]], query: np.ndarray, versions: int) -> list[tuple[int, float]]:
    """The exact nearest Versions among (label, version_id, stored unit vector) rows."""
    if not rows:
        return []
    labels = np.asarray([r[0] for r in rows], dtype=np.int64)
    scores = _matrix(r[2] for r in rows) @ query
    return _best_per_version(labels, scores, {r[0]: r[1] for r in rows}, versions)


def _walk(index: hnswlib.Index, query: np.ndarray, labels: np.ndarray,
          k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """hnswlib's filtered graph walk over the allowed labels: (labels, cosine similarities),
    or None when it cannot return k."""
    k = min(k, len(labels))
    if k == 0:
        return labels, np.zeros(0, dtype=np.float32)
    allowed = set(labels.tolist())
    try:
        found, distances = index.knn_query(query, k=k, num_threads=1, filter=allowed.__contains__)
    except RuntimeError:  # fewer than k allowed elements reachable (or live)
        return None
    return found[0].astype(np.int64), 1.0 - distances[0]


def _best_per_version(labels: np.ndarray, scores: np.ndarray, version_of: dict[int, str],
                      versions: int) -> list[tuple[int, float]]:
    """Each Version's best label, best Versions first (ties by label), at most `versions`."""
    best: dict[str, tuple[int, float]] = {}
    for i in np.lexsort((labels, -scores)):
        version_id = version_of[int(labels[i])]
        if version_id not in best:
            best[version_id] = (int(labels[i]), float(scores[i]))
            if len(best) == versions:
                break
    return list(best.values())
