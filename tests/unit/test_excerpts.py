"""Excerpts: exact code-point windows of the Part text (part 1 rule 20: every hit carries an
excerpt whose text is `part_text[start:end]`), the fast path (every text without CJK) finding
the same query words as the general scan, and the one-pass window choosing as counting does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contentsvc.search import excerpts
from contentsvc.search.excerpts import WINDOW, excerpt, query_terms

# Latin letters with their case pairs and a few that case-fold oddly (long s, dotless and dotted
# i, sharp s, title-case digraphs), digits, punctuation and spaces; some texts reach beyond Latin.
LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéÉüÜßſıİǅǄǆøØ0123456789"
words = st.text(alphabet=LATIN, min_size=1, max_size=12)
texts = st.lists(st.one_of(words, st.sampled_from(["studies", "Studying", "DYING", "ſtudy", "東京都", "Ωmega"])),
                 min_size=1, max_size=120).map(" ".join)


def general_scan(text: str, terms: frozenset[str]) -> list[tuple[int, int, str]]:
    """The scan every text used to get: case-insensitive, over the text as given."""
    return [(m.start(), m.end(), t) for m in excerpts._candidate_words(terms).finditer(text)
            for t in excerpts._terms(m.group().lower()) if t in terms]


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(words, min_size=1, max_size=6))
def test_the_fast_path_finds_what_the_general_scan_finds(text, query_words):
    terms = query_terms(" ".join(query_words + text.split()[:2]))
    assert excerpts._hits(text, terms) == general_scan(text, terms)


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(words, min_size=1, max_size=6), st.integers(0, 5000))
def test_an_excerpt_is_a_window_of_the_text_at_its_offset(text, query_words, offset):
    start, end = excerpt(text, query_terms(" ".join(query_words)), offset=offset)
    assert offset <= start <= end <= offset + len(text)
    assert end - start <= WINDOW


def test_the_window_holding_most_query_words_wins():
    text = "filler " * 60 + "malaria vaccines protect children " + "filler " * 60
    start, end = excerpt(text, query_terms("malaria vaccine children"))
    assert "malaria vaccines protect children" in text[start:end]


def most_terms_start(hits: list[tuple[int, int, str]], window: int) -> int:
    """The first hit start whose window holds the most distinct terms, counted from scratch."""
    best_start, best_score = 0, 0
    for start, _, _ in hits:
        score = len({t for s, e, t in hits if s >= start and e - start <= window})
        if score > best_score:
            best_start, best_score = start, score
    return best_start


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(words, min_size=1, max_size=6), st.integers(1, 300))
def test_the_sliding_window_finds_the_window_with_most_distinct_terms(text, query_words, window):
    # part 1 rule 20: the excerpt shows where the query's words are; the one-pass window
    # agrees with counting every window from scratch
    terms = query_terms(" ".join(query_words + text.split()[::3]))
    hits = excerpts._hits(text, terms)
    assert excerpts._best_window_start(hits, window) == most_terms_start(hits, window)
