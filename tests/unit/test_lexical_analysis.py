"""Lexical analysis (issue "Search quality": English stemming, CJK bigrams, title and body in one
field) and the index layouts: an index keeps the analysis it was built with (docs/decisions.md
"Lexical analysis")."""

from __future__ import annotations

import json

import msgspec
import tantivy
from hypothesis import given, strategies as st

from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL
from contentsvc.search import analysis, lexical_index
from contentsvc.search.lexical_index import CURRENT, LEGACY, NAMED_ANALYZER, ONE_FIELD, LexicalWriter
from tests.unit.test_retrieval import PAYLOAD

CJK_CHARS = st.sampled_from("東京都北京大学研究者にいるのカタカナ한국어분석")
LATIN_WORDS = st.from_regex(r"[a-z]{1,12}", fullmatch=True)


def test_english_words_are_stemmed_and_nothing_is_a_stop_word():
    assert analysis.terms("The Studies running") == ["the", "studi", "run"]


@given(st.lists(LATIN_WORDS, max_size=20))
def test_text_without_cjk_is_left_as_it_is(words):
    text = " ".join(words)
    assert analysis.cjk_bigrams(text) == text


@given(st.text(CJK_CHARS, min_size=2, max_size=30))
def test_a_cjk_run_is_its_overlapping_bigrams(run):
    assert analysis.terms(run) == [run[i:i + 2] for i in range(len(run) - 1)]


@given(LATIN_WORDS, CJK_CHARS, LATIN_WORDS)
def test_a_single_cjk_character_stands_alone_between_latin_words(before, char, after):
    assert analysis.terms(f"{before}{char}{after}") == [*analysis.terms(before), char, *analysis.terms(after)]


@given(st.text(st.characters(codec="utf-8"), max_size=60))
def test_the_quick_test_for_cjk_agrees_with_the_scan_of_every_character(text):
    # The two-range pre-check may only skip text the eleven CJK ranges hold nothing of.
    assert analysis.holds_cjk(text) == (analysis._CJK_RUN.search(text) is not None)


MIXED_TEXT = st.lists(st.one_of(
    st.sampled_from(["Running", "studies", "the", "naïve", "CAFÉ", "don't", "e-mail", "β-cells", "x" * 41,
                     "IL-6", "2.5mg", "東京都", "한국어", "mice", "generalizations"]),
    st.text(st.characters(codec="utf-8"), max_size=12)), max_size=12).map(" ".join)


@given(MIXED_TEXT)
def test_the_built_in_analyzer_of_new_indexes_makes_the_terms_of_the_earlier_one(text):
    # New indexes name Tantivy's en_stem, earlier ones the same filters chained (build_analyzer):
    # a query against either, and the excerpts' terms, must meet the same indexed terms, and each
    # text must count as many terms (BM25's length norm, seen in a second document's score).
    prepared = analysis.cjk_bigrams(text)
    expected = analysis.build_analyzer().analyze(prepared)

    def scores(analyzer: str) -> list[float]:
        schema = tantivy.SchemaBuilder().add_text_field("text", tokenizer_name=analyzer).build()
        index = tantivy.Index(schema)
        if analyzer != analysis.ANALYZER:
            index.register_tokenizer(analyzer, analysis.build_analyzer())
        writer = index.writer(15_000_000, 1)
        writer.add_document(tantivy.Document(text=prepared))
        writer.add_document(tantivy.Document(text="zyzzyva zyzzyva quokka"))
        writer.commit()
        index.reload()
        searcher = index.searcher()
        terms = [tantivy.Query.term_query(schema, "text", t) for t in [*expected, "zyzzyva"]]
        return [hits[0][0] if (hits := searcher.search(q, 2).hits) else 0.0 for q in terms]

    assert scores(analysis.ANALYZER) == scores(analysis.EARLIER_ANALYZER)


def _search(path, query):
    index, layout = lexical_index.open_index(path)
    return layout, [c.record_id for c in lexical_index.search(index, layout, "org", ["proj"], query, 10)]


def _write(path):
    writer = LexicalWriter(path)
    writer.add_version("org", "proj", DEFAULT_RETRIEVAL, PAYLOAD)
    writer.commit(1)
    writer.close()


def test_a_new_index_scores_title_and_body_in_one_field(tmp_path):
    _write(tmp_path)
    fields = {f["name"] for f in json.loads((tmp_path / "meta.json").read_text())["schema"]}
    assert "text" in fields and not {"title", "body"} & fields
    assert _search(tmp_path, "titles bodies") == (CURRENT, ["rec_x"])  # stemmed, both texts


def test_an_index_built_with_the_earlier_layout_keeps_its_analysis(tmp_path):
    # Created as before the one-field layout: title, body and fields apart, stop words removed.
    index = tantivy.Index(LEGACY.schema(), path=str(tmp_path))
    del index
    _write(tmp_path)  # the writer adds in the index's own layout
    assert _search(tmp_path, "body") == (LEGACY, ["rec_x"])
    assert _search(tmp_path, "the")[1] == []  # a stop word there, as it always was


def test_a_new_index_keeps_each_segment_text_for_the_excerpts(tmp_path):
    # part1 "Agent-tool result shapes" (excerpt offsets in code points, text the exact slice):
    # the stored segment is the Part's text from segment_start, so an excerpt cut from it is.
    text = ("naïve 😀 東京 crème " * 700) + "needle " + ("señor 🏳️‍🌈 " * 500)
    payload = msgspec.structs.replace(PAYLOAD, manifest={"parts": [
        {"key": "body", "role": "body", "content": {"kind": "text", "text": text}}]})
    writer = LexicalWriter(tmp_path)
    writer.add_version("org", "proj", DEFAULT_RETRIEVAL, payload)
    writer.commit(1)
    writer.close()
    index, layout = lexical_index.open_index(tmp_path)
    assert layout is CURRENT
    _, segments = lexical_index.segments_of(payload.manifest)
    assert len(segments) >= 3
    [hit] = lexical_index.search(index, layout, "org", ["proj"], "needle", 10)
    assert hit.text == text[hit.segment_start:hit.segment_start + len(hit.text)] == \
        lexical_index.segment_at(text, hit.segment_start)
    assert "needle" in hit.text
    # The segments another retriever found, looked up by their keys; one the index lacks is left out.
    wanted = [("proj", "ver_x", "body", s.start) for s in segments] + [("proj", "ver_gone", "body", 0)]
    found = lexical_index.stored_segments(index, layout, wanted)
    assert found == {("proj", "ver_x", "body", s.start): s.text for s in segments}


def test_an_index_built_before_segments_were_stored_leaves_them_to_the_version(tmp_path):
    # Created with one text field but no stored segments: searched as it is, its hits carry no
    # text, and the search service cuts their excerpts from the Versions' texts.
    index = tantivy.Index(ONE_FIELD.schema(), path=str(tmp_path))
    del index
    _write(tmp_path)
    index, layout = lexical_index.open_index(tmp_path)
    assert layout is ONE_FIELD
    [hit] = lexical_index.search(index, layout, "org", ["proj"], "titles bodies", 10)
    assert (hit.record_id, hit.text) == ("rec_x", None)
    assert lexical_index.stored_segments(index, layout, [("proj", "ver_x", "body", 0)]) == {}


def test_an_index_built_with_the_analyzer_by_its_earlier_name_is_current_and_searchable(tmp_path):
    # Its text field names the registered analyzer that chains en_stem's filters: the same
    # terms, so it is read and written as it is, and no replay is asked for.
    index = tantivy.Index(NAMED_ANALYZER.schema(), path=str(tmp_path))
    del index
    _write(tmp_path)
    assert _search(tmp_path, "titles bodies") == (NAMED_ANALYZER, ["rec_x"])
    assert not NAMED_ANALYZER.outdated and ONE_FIELD.outdated and LEGACY.outdated and not CURRENT.outdated
    tokenizer = {f["name"]: f["options"] for f in json.loads((tmp_path / "meta.json").read_text())["schema"]}
    assert tokenizer["text"]["indexing"]["tokenizer"] == analysis.EARLIER_ANALYZER
