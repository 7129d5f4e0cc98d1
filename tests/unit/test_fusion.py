"""Hybrid fusion (issue "Search quality": z-score fusion by default, reciprocal-rank fusion kept;
docs/decisions.md "Hybrid fusion")."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, strategies as st

from contentsvc.search.fusion import Fusion


@dataclass(frozen=True)
class Hit:
    version_id: str
    score: float


def ranking(pairs):
    return [Hit(v, s) for v, s in pairs]


ZSCORE, RRF = Fusion("zscore", lexical_weight=0.5), Fusion("rrf", rrf_k=10)


def test_rrf_adds_reciprocal_ranks():
    fused = RRF.fuse(ranking([("a", 9.0), ("b", 5.0)]), ranking([("b", 0.9), ("c", 0.8)]))
    assert [(h.version_id, round(s, 6)) for h, s in fused] == [
        ("b", round(1 / 12 + 1 / 11, 6)), ("a", round(1 / 11, 6)), ("c", round(1 / 12, 6))]


def test_zscore_keeps_how_far_ahead_a_clear_winner_is():
    # Lexically "a" is far ahead; semantically "b" leads by a hair. Ranks call it a tie; z-scores
    # let the clear lexical lead decide.
    lexical = ranking([("a", 30.0), ("b", 5.0), ("c", 4.0), ("d", 3.0)])
    semantic = ranking([("b", 0.81), ("a", 0.80), ("c", 0.5), ("d", 0.4)])
    fused = dict((h.version_id, s) for h, s in ZSCORE.fuse(lexical, semantic))
    assert fused["a"] > fused["b"] + 0.5
    rrf = dict((h.version_id, s) for h, s in RRF.fuse(lexical, semantic))
    assert rrf["a"] == rrf["b"]


def test_a_tie_keeps_the_order_the_lists_hold_the_versions_in():
    # Two Versions that swap places between the lists tie exactly at equal weights (z-scores +1 and
    # -1 in each). The tie keeps the lexical list's order, whatever the ids (they decided it by
    # their string hashes, randomized per process: one order or the other after a restart).
    for n in range(40):
        first, second = f"ver_{n:02d}a", f"ver_{n:02d}b"
        for lexical_order in ((first, second), (second, first)):
            lexical = ranking([(lexical_order[0], 2.0), (lexical_order[1], 1.0)])
            semantic = ranking([(lexical_order[1], 0.9), (lexical_order[0], 0.1)])
            fused = ZSCORE.fuse(lexical, semantic)
            assert [s for _, s in fused] == [0.0, 0.0]
            assert [h.version_id for h, _ in fused] == list(lexical_order)


def test_a_version_missing_from_a_list_gets_its_lowest_score_there():
    lexical = ranking([("a", 10.0), ("b", 1.0)])
    semantic = ranking([("c", 0.9), ("a", 0.1)])
    fused = dict((h.version_id, s) for h, s in ZSCORE.fuse(lexical, semantic))
    assert fused["b"] == 0.5 * -1.0 + 0.5 * -1.0  # lowest in lexical (z = -1), missing semantically (z = -1)


def test_the_first_list_cites_the_version():
    lexical = [Hit("a", 2.0)]
    semantic = [Hit("a", 0.5), Hit("b", 0.4)]
    assert ZSCORE.fuse(lexical, semantic)[0][0] is lexical[0]


scores = st.lists(st.tuples(st.sampled_from("abcdefgh"), st.floats(0, 100)), max_size=8, unique_by=lambda p: p[0])


@given(scores, scores)
def test_every_candidate_once_in_descending_fused_score(lexical, semantic):
    for fusion in (ZSCORE, RRF):
        fused = fusion.fuse(ranking(lexical), ranking(semantic))
        assert sorted(h.version_id for h, _ in fused) == sorted({v for v, _ in lexical + semantic})
        assert [s for _, s in fused] == sorted((s for _, s in fused), reverse=True)


@given(scores)
def test_one_list_alone_keeps_its_order(only):
    only = sorted(only, key=lambda p: -p[1])
    for fusion in (ZSCORE, RRF):
        assert [h.version_id for h, _ in fusion.fuse(ranking(only), [])] == [v for v, _ in only]
