"""Excerpts: exact code-point windows of the Part text (part 1 rule 20: every hit carries an
excerpt whose text is `part_text[start:end]`), the fast path (every text without CJK) finding
the same query words as the general scan, and the one-pass window choosing as weighing every
window does."""

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


# ASCII words glued by what \w does not hold (punctuation, hyphens, apostrophes) and by what it
# does (underscores, digits), with the query words often inside longer words.
ASCII = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
ascii_words = st.text(alphabet=ASCII, min_size=1, max_size=12)
ascii_texts = st.lists(st.tuples(st.one_of(ascii_words, st.sampled_from(["studies", "Studying", "DYING", "in", "inin"])),
                                 st.sampled_from([" ", "  ", ", ", "-", "'", ".\n", "(", "/"])),
                       min_size=1, max_size=120).map(lambda pairs: "".join(w + sep for w, sep in pairs))


@settings(max_examples=300, deadline=None)
@given(ascii_texts, st.lists(st.one_of(ascii_words, st.sampled_from(["study", "die", "in"])), min_size=1, max_size=6))
def test_the_ascii_scan_finds_what_the_general_scan_finds(text, query_words):
    # part 1 rule 20: the ASCII scan (bytes, non-word characters as spaces) finds the same words,
    # at the same code-point offsets, as the general scan
    terms = query_terms(" ".join(query_words + text.split()[:2]))
    assert text.isascii()
    assert excerpts._hits(text, terms) == general_scan(text, terms)


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(words, min_size=1, max_size=6), st.integers(0, 5000), st.booleans(), st.randoms())
def test_an_excerpt_is_a_window_of_the_text_at_its_offset(text, query_words, offset, weighted, random):
    terms = query_terms(" ".join(query_words + text.split()[::5]))
    weights = {t: random.uniform(0.01, 12.0) for t in terms} if weighted else None
    start, end = excerpt(text, terms, offset=offset, weights=weights)
    assert offset <= start <= end <= offset + len(text)
    assert end - start <= WINDOW


def test_a_light_term_does_not_choose_the_window():
    # Weighing under a tenth of the heaviest, "the" is left out: the window starts near the rare
    # word, not at the run of "the" just before it, which would push the rare word's neighbours out.
    text = "filler " * 50 + "the " * 30 + "mitochondria " + "matter " * 40 + "apoptosis " + "filler " * 50
    terms = query_terms("the mitochondria apoptosis")
    weights = {"the": 0.01, "mitochondria": 5.0, "apoptosi": 5.0}
    start, end = excerpt(text, terms, weights=weights)
    assert text.index("mitochondria") - start <= WINDOW // 4  # the lead before the first term that counts


def test_the_window_holding_most_query_words_wins():
    text = "filler " * 60 + "malaria vaccines protect children " + "filler " * 60
    start, end = excerpt(text, query_terms("malaria vaccine children"))
    assert "malaria vaccines protect children" in text[start:end]


def test_the_window_holding_the_rarer_query_words_wins():
    # A query's common words ("the", "of", "in") weigh next to nothing against its rare ones: the
    # window with three of them loses to the one with "mitochondria" and "apoptosis".
    text = ("the role of the cell in the study of tissue " * 3 + "filler " * 40
            + "mitochondria drive apoptosis " + "filler " * 40)
    terms = query_terms("the role of mitochondria in apoptosis")
    weights = {term: 0.05 for term in terms} | {"mitochondria": 6.0, "apoptosi": 7.0}
    start, end = excerpt(text, terms)
    assert "mitochondria" not in text[start:end]  # counted alone, the common words win
    start, end = excerpt(text, terms, weights=weights)
    assert "mitochondria drive apoptosis" in text[start:end]


def heaviest_start(hits: list[tuple[int, int, str]], window: int, weights: dict[str, float] | None) -> int:
    """The first hit start whose window holds the heaviest set of distinct terms, summed from scratch."""
    best_start, best_score = 0, 0.0
    for start, _, _ in hits:
        score = sum(1.0 if weights is None else weights[t] for t in {t for s, e, t in hits
                                                                         if s >= start and e - start <= window})
        if score > best_score:
            best_start, best_score = start, score
    return best_start


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(words, min_size=1, max_size=6), st.integers(1, 300), st.booleans(), st.randoms())
def test_the_sliding_window_finds_the_heaviest_window(text, query_words, window, weighted, random):
    # part 1 rule 20: the excerpt shows where the query's words are; the one-pass window
    # agrees with weighing every window from scratch, its terms counted alone or weighted
    terms = query_terms(" ".join(query_words + text.split()[::3]))
    weights = {t: float(random.randint(1, 20)) for t in terms} if weighted else None
    hits = excerpts._hits(text, terms)
    assert excerpts._best_window_start(hits, window, weights) == heaviest_start(hits, window, weights)
