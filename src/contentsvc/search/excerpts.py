"""Excerpts in Unicode code points: `text == part_text[start:end]`, half-open.

Tantivy's own snippets give UTF-8 byte ranges relative to a fragment, so
the excerpt is computed here from the hit's segment of the Part text: words are matched
with the index's analysis (same stemming, CJK bigrams), and the window whose distinct query
terms weigh most wins. A term weighs its inverse document frequency in the lexical index
(lexical_index.term_weights) where the search has one, else 1: a window holding a query's
"the", "of" and "in" then loses to the one holding its "mitochondria". A term weighing under a
tenth of the query's heaviest is left out of the choice altogether: it could only break ties,
and finding every "the" and "of" of a text was half of an excerpt's time.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Mapping

from contentsvc.search import analysis

WINDOW = 240  # code points
LIGHT_SHARE = 0.1  # of the heaviest query term's weight: a term weighing less does not choose the window
_WORD = re.compile(r"\w+", re.UNICODE)


@lru_cache(maxsize=65536)
def _terms(word: str) -> tuple[str, ...]:
    return tuple(analysis.terms(word))


def query_terms(query: str) -> frozenset[str]:
    query = unicodedata.normalize("NFC", query)  # as the indexed texts are
    return frozenset(t for w in _WORD.findall(query) for t in _terms(w.lower()))


# Snowball English only rewrites the ends of words: a word analyzed into a term starts with all
# but the term's last letter (at least its first two), save dying/lying/tying -> die/lie/tie
# (checked on every word of SciFact and Cranfield). So only words starting with such a head are
# analyzed; with two letters, three in four of a SciFact abstract's candidates were other words.
@lru_cache(maxsize=4096)
def _heads(terms: frozenset[str]) -> tuple[str, ...]:
    """The query's heads, none starting with another (a word starting with the longer one starts
    with the shorter one too). Sorted, a head comes after the heads it starts with."""
    kept: list[str] = []
    for head in sorted({t[:max(2, len(t) - 1)] for t in terms}):
        if not kept or not head.startswith(kept[-1]):
            kept.append(head)
    return tuple(kept)


# The general scan, for texts holding CJK (a run holds its bigrams anywhere, so every word with a
# character beyond Latin script is analyzed) or whose lowercasing changes their length.
@lru_cache(maxsize=4096)
def _candidate_words(terms: frozenset[str]) -> re.Pattern:
    heads = "|".join(map(re.escape, sorted(_heads(terms), key=len, reverse=True))) or "(?!)"
    return re.compile(rf"(?<!\w)(?:(?:{heads})\w*|\w*[^\W\x00-\u024f]\w*)", re.IGNORECASE)




def _word_starts(lowered: str, heads: tuple[str, ...]) -> list[int]:
    """Where the words of `lowered` that start with a head start, in order. str.find per head
    instead of one regular expression tried at every position: 46 us against 62 on a SciFact
    abstract, and nothing to compile for each new query."""
    starts = set()
    find = lowered.find
    for head in heads:
        step = len(head)  # an occurrence overlapping this one is inside a word
        at = find(head)
        while at >= 0:
            if at == 0 or not (lowered[at - 1].isalnum() or lowered[at - 1] == "_"):  # re's \w
                starts.add(at)
            at = find(head, at + step)
    return sorted(starts)


# ASCII text (three in four SciFact abstracts) is scanned as bytes in which every character that
# is not a word character (re's \w) is a space: a word start is then a space followed by a head,
# found by one C-speed search per occurrence, where the str scan also stopped at each occurrence
# inside a word to look at the character before it; and the word ends at the next space.
_SPACED = bytes(c if chr(c).isalnum() or c == 0x5F else 0x20 for c in range(128)) + b" " * 128


@lru_cache(maxsize=4096)
def _spaced_heads(terms: frozenset[str]) -> tuple[bytes, ...]:
    # A head beyond ASCII is never found in an ASCII text, as no word of one analyzes to its term.
    return tuple(b" " + head.encode() for head in _heads(terms))


def _ascii_hits(text: str, terms: frozenset[str]) -> list[tuple[int, int, str]]:
    lowered = text.lower()
    spaced = b" " + lowered.encode("ascii").translate(_SPACED)  # spaced[i + 1] is lowered[i]
    find = spaced.find
    starts = []  # the space before a word at text offset i is at spaced offset i
    for head in _spaced_heads(terms):
        at = find(head)
        while at >= 0:
            starts.append(at)  # heads start no other head: a word start matches at most one
            at = find(head, at + len(head))
    starts.sort()
    hits = []
    for start in starts:
        end = find(b" ", start + 1)
        end = (end if end >= 0 else len(spaced)) - 1
        for term in _terms(lowered[start:end]):
            if term in terms:
                hits.append((start, end, term))
    return hits


def _hits(text: str, terms: frozenset[str]) -> list[tuple[int, int, str]]:
    """(start, end, query term) of each word of `text` that the analysis turns into a query term."""
    if text.isascii():
        return _ascii_hits(text, terms)
    # Lowercasing keeps every offset when it keeps the length (it never shortens a text).
    if not analysis.holds_cjk(text) and len(lowered := text.lower()) == len(text):
        hits = []
        word_end = _WORD.match  # bound once: this loop is most of an excerpt's time
        for start in _word_starts(lowered, _heads(terms)):
            end = word_end(lowered, start).end()
            for term in _terms(text[start:end].lower()):
                if term in terms:
                    hits.append((start, end, term))
        return hits
    return [(m.start(), m.end(), t) for m in _candidate_words(terms).finditer(text)
            for t in _terms(m.group().lower()) if t in terms]


def _best_window_start(hits: list[tuple[int, int, str]], window: int, weights: Mapping[str, float] | None) -> int:
    """The start of the first hit whose window of `window` code points holds the heaviest set of
    distinct query terms (each weighing 1 without weights): one pass, the window's term counts
    and their weight kept as it slides (rebuilding a set per hit was half an excerpt's time on a
    SciFact abstract)."""
    weight = weights or {}
    ends = [end for _, end, _ in hits]  # hits end in order: words do not overlap
    names = [term for _, _, term in hits]
    n = len(hits)
    counts: dict[str, int] = {}
    best_start, best_score, score, k = 0, 0.0, 0.0, 0
    for j, (start, _, term) in enumerate(hits):
        if k < j:
            k = j
        last_end = start + window
        while k < n and ends[k] <= last_end:  # hit k enters the window
            entering = names[k]
            held = counts.get(entering, 0)
            if not held:
                score += weight.get(entering, 1.0)
            counts[entering] = held + 1
            k += 1
        if score > best_score + 1e-9:
            best_score, best_start = score, start
        if j < k:  # hit j leaves the window
            held = counts[term] - 1
            if held:
                counts[term] = held
            else:
                del counts[term]
                score -= weight.get(term, 1.0)
    return best_start


class Excerpter:
    """The excerpts of one query's texts: which of its terms choose the window is settled once,
    not for each text."""

    def __init__(self, terms: frozenset[str], weights: Mapping[str, float] | None = None,
                 window: int = WINDOW) -> None:
        """`weights`: each query term's weight (absent: every term weighs 1)."""
        if weights and terms:
            floor = LIGHT_SHARE * max(weights.get(t, 1.0) for t in terms)
            terms = frozenset(t for t in terms if weights.get(t, 1.0) >= floor)
        self.terms, self.weights, self.window = terms, weights, window

    def cut(self, text: str, offset: int = 0) -> tuple[int, int]:
        """The [start, end) of the best window of `text`, shifted by `offset`."""
        window = self.window
        if len(text) <= window:
            return offset, offset + len(text)
        start = _best_window_start(_hits(text, self.terms), window, self.weights)
        if start > 0:  # show a little context before the first match, at a word boundary
            lead = max(0, start - window // 4)
            boundary = text.find(" ", lead, start)
            start = boundary + 1 if boundary >= 0 else lead
        end = min(len(text), start + window)
        if end < len(text):
            cut = text.rfind(" ", start + window // 2, end)
            end = cut if cut > start else end
        return offset + start, offset + end


def excerpt(text: str, terms: frozenset[str], *, offset: int = 0, window: int = WINDOW,
            weights: Mapping[str, float] | None = None) -> tuple[int, int]:
    """The [start, end) of the best window of `text`, shifted by `offset` (Excerpter.cut)."""
    return Excerpter(terms, weights, window).cut(text, offset)
