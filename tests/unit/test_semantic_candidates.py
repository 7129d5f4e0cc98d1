"""Ranking the allowed labels of a real hnswlib index (search/semantic.py; part 1 rule 20).

The end-to-end proof is tests/e2e/test_semantic_scope.py; this checks the two ways
of ranking against each other, which the end-to-end scopes (a few thousand vectors)
never both reach, and a snapshot's deleted label.
"""

from __future__ import annotations

import numpy as np

from contentsvc.search import semantic, vector_index
from contentsvc.search.embedding import DIMENSIONS

COUNT = 3000


def _index():
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(COUNT, DIMENSIONS)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = vector_index.new_index(COUNT)
    labels = np.arange(1, COUNT + 1, dtype=np.int64)
    index.add_items(vectors, labels, num_threads=1)
    query = vectors[0] + 0.5 * rng.normal(size=DIMENSIONS).astype(np.float32)
    return index, labels, vectors, query / np.linalg.norm(query)


def test_the_filtered_walk_ranks_only_allowed_labels_as_the_exact_scan_does():
    index, labels, vectors, query = _index()
    allowed = labels[labels % 3 == 0]  # a third of the index: another Corpus holds the rest
    version_of = {int(label): f"v{label // 6}" for label in allowed}  # two segments per Version
    rows = [(int(label), version_of[int(label)], vector_index.to_bytes(vectors[label - 1])) for label in allowed]
    exact = semantic._exact(rows, query, 10)
    truth = sorted(allowed.tolist(), key=lambda label: -float(vectors[label - 1] @ query))
    assert exact[0][0] == truth[0] and abs(exact[0][1] - float(vectors[truth[0] - 1] @ query)) < 1e-5
    assert len({version_of[label] for label, _ in exact}) == 10  # one label per Version
    assert [s for _, s in exact] == sorted((s for _, s in exact), reverse=True)

    walked = semantic._walk(index, query, allowed, 40)
    assert set(walked[0].tolist()) <= set(allowed.tolist())
    best = semantic._best_per_version(*walked, version_of, 10)
    assert len({label for label, _ in best} & {label for label, _ in exact}) >= 8


def test_the_walk_reports_a_short_answer_instead_of_fewer_labels():
    index, labels, _, query = _index()
    for label in (3, 6):
        index.mark_deleted(label)
    walked = semantic._walk(index, query, np.asarray([3, 6, 9], dtype=np.int64), 3)
    assert walked is None  # two of the three are deleted in this snapshot: the exact scan answers


def test_served_index_knows_which_labels_its_snapshot_holds():
    index, _, _, _ = _index()
    served = semantic.ServedIndex.of(index)
    probe = np.asarray([0, 1, COUNT, COUNT + 1, 10**9], dtype=np.int64)
    assert served.holds(probe).tolist() == [False, True, True, False, False]
