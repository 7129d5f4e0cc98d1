"""How a lexical search reads its candidates from a real Tantivy index (part 1 rule 20: a search
reads exactly the projection generations its Corpora are routed to; docs/decisions.md Search):
the filters are checked on the hits where the routed generations hold every document, and
stored documents are read only until the wanted Versions are among them."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings, strategies as st

from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL
from contentsvc.search import lexical_index
from contentsvc.search.lexical_index import SEGMENT_CHARS, LexicalWriter
from tests.unit.test_retrieval import PAYLOAD

WORDS = ["alpha", "beta", "gamma", "delta"]


def _version(n: int, text: str):
    return msgspec.structs.replace(PAYLOAD, record_id=f"rec_{n}", version_id=f"ver_{n}", manifest={"parts": [
        {"key": "body", "role": "body", "content": {"kind": "text", "text": text}}]})


def _index(path, documents: list[tuple[str, str]]):
    """An index holding one Version per (projection, text), committed and opened for search."""
    writer = LexicalWriter(path)
    for n, (projection, text) in enumerate(documents):
        writer.add_version(f"org_{projection}", projection, DEFAULT_RETRIEVAL, _version(n, text))
    writer.commit(1)
    writer.close()
    index, layout = lexical_index.open_index(path)
    index.reload()
    return index, layout


def _found(index, layout, projection: str, query: str, versions: int, alone: bool):
    return [(c.version_id, c.segment_start, c.score) for c in
            lexical_index.search(index, layout, f"org_{projection}", [projection], query, versions, alone=alone)]


DOCUMENTS = st.lists(st.tuples(st.sampled_from(["p1", "p2"]),
                               st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join)),
                     min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(documents=DOCUMENTS, query=st.sampled_from(WORDS), versions=st.integers(1, 8), told_alone=st.booleans())
def test_checking_the_filter_on_the_hits_finds_what_the_filtered_query_finds(tmp_path_factory, documents, query,
                                                                               versions, told_alone):
    # Whatever the search is told (a stale "alone" included), its hits are the filtered query's.
    index, layout = _index(tmp_path_factory.mktemp("index"), documents)
    assert lexical_index.holds_everything(index, ["p1"]) == all(p == "p1" for p, _ in documents)
    assert lexical_index.holds_everything(index, ["p1", "p2"])
    assert _found(index, layout, "p1", query, versions, alone=told_alone) == \
        _found(index, layout, "p1", query, versions, alone=False)


def test_another_projections_document_among_the_hits_sends_the_search_through_the_filters(tmp_path):
    index, layout = _index(tmp_path, [("p1", "alpha"), ("p2", "alpha alpha alpha"), ("p1", "alpha beta")])
    assert not lexical_index.holds_everything(index, ["p1"])
    assert [v for v, _, _ in _found(index, layout, "p1", "alpha", 5, alone=True)] == ["ver_0", "ver_2"]


def test_a_long_versions_segments_do_not_crowd_out_the_versions_wanted(tmp_path):
    # Each of ver_0's segments outscores ver_1 and ver_2: reading until three Versions are seen
    # asks Tantivy again, for more hits, when the first ones hold too few Versions.
    segment = ("alpha " * (SEGMENT_CHARS // 6 - 1)).strip()
    long_text = "\n\n".join([segment] * 8)
    index, layout = _index(tmp_path, [("p1", long_text), ("p1", "alpha beta gamma delta"), ("p1", "beta alpha")])
    found = _found(index, layout, "p1", "alpha", 3, alone=False)
    assert len({start for v, start, _ in found if v == "ver_0"}) > 1  # several segments of the long one
    assert {v for v, _, _ in found} == {"ver_0", "ver_1", "ver_2"}
    assert [v for v, _, _ in _found(index, layout, "p1", "alpha", 1, alone=False)] == ["ver_0"]
