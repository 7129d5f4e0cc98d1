"""Lexical analysis: how text becomes the terms an index holds and a query looks for.

English text is stemmed (Tantivy's `en_stem`: words split at non-alphanumerics, longer than
40 bytes dropped, lowercased, Snowball English stems), and no stop word is removed: BM25
already weighs the frequent words down, and on SciFact removing them lost 0.001 nDCG@10.

Han, Hiragana, Katakana and Hangul are written without spaces between words, so a run of
them would otherwise be one term no query ever matches. Such runs become overlapping
bigrams ("東京都" -> "東京 京都"; a lone character stays itself), the usual CJK analysis
of Lucene's CJKBigramFilter, before the text reaches the tokenizer. The same function
prepares the indexed texts, the queries and the excerpt windows, so all three agree.
"""

from __future__ import annotations

import re

import tantivy

# The analyzer's name is stored in each index's schema: an index keeps the analysis it was
# built with until it is rebuilt (`contentsvc projector replay lexical`). New indexes name
# Tantivy's built-in `en_stem`, which needs no registering and, composed statically, indexes
# about 13% faster than the same filters chained at run time (build_analyzer).
ANALYZER = "en_stem"
# The same analysis under the name indexes built before carry: build_analyzer() is registered for it.
EARLIER_ANALYZER = "contentsvc_en_stem_cjk2"

_CJK = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u3130-\u318f"  # Hangul compatibility Jamo
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # Han extension A
    "\u4e00-\u9fff"  # Han
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # Han compatibility
    "\uff66-\uff9f"  # half-width Katakana
    "\U00020000-\U0002fa1f"  # Han extensions B-F and supplement
)
_CJK_RUN = re.compile(f"[{_CJK}]+")


def _bigrams(run: re.Match) -> str:
    chars = run.group()
    if len(chars) == 1:
        return f" {chars} "
    return " " + " ".join(chars[i:i + 2] for i in range(len(chars) - 1)) + " "


# Below U+1100 (Latin, Greek, Cyrillic and the other alphabets) and from U+1200 to U+303F
# (punctuation, symbols, arrows) no range above begins: a two-range class the pattern engine
# tests several times faster than the eleven ranges (SciFact's non-ASCII abstracts: 6 ms for all
# against 30), so only text with a character beyond them is scanned for CJK runs.
_MAYBE_CJK = re.compile("[^\x00-\u10ff\u1200-\u303f]")


def holds_cjk(text: str) -> bool:
    # Most text is ASCII: a C-speed test before any pattern's scan.
    return not text.isascii() and _MAYBE_CJK.search(text) is not None and _CJK_RUN.search(text) is not None


def cjk_bigrams(text: str) -> str:
    """`text` with every CJK run replaced by its space-separated bigrams (other text unchanged)."""
    return _CJK_RUN.sub(_bigrams, text) if holds_cjk(text) else text


def build_analyzer(stop_words: list[str] | None = None) -> tantivy.TextAnalyzer:
    """`en_stem`, filter by filter (the terms of the excerpts' and queries' analysis, and of indexes
    named EARLIER_ANALYZER); `stop_words` only for indexes of the first layout, which removed them."""
    builder = (tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
               .filter(tantivy.Filter.remove_long(40))
               .filter(tantivy.Filter.lowercase()))
    if stop_words:
        builder = builder.filter(tantivy.Filter.custom_stopword(stop_words))
    return builder.filter(tantivy.Filter.stemmer("english")).build()


_ANALYZER = build_analyzer()


def terms(text: str) -> list[str]:
    """The terms `text` is indexed or searched as."""
    return _ANALYZER.analyze(cjk_bigrams(text))
