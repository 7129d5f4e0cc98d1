"""The API's lexical searcher sees every commit of the serving generation by the next search.

Part 1, ingest rules: "Text is searchable only when `availability.searchable` is true, so
callers poll `read_receipt`". The lexical projector commits the index before it publishes
availability, so a search after a Receipt shows `searchable` must read that commit, whatever
the API process has or has not been told meanwhile (no notification reaches it here).
"""

from __future__ import annotations

import msgspec
import pytest

from contentsvc.domain.errors import ApiError
from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL
from contentsvc.search import generations, lexical_index
from contentsvc.search.service import LexicalSearcher
from tests.unit.test_retrieval import PAYLOAD

GENERATION = "gen_test"


def _version(n: int, word: str):
    return msgspec.structs.replace(PAYLOAD, record_id=f"rec_{n}", version_id=f"ver_{n}", manifest={"parts": [
        {"key": "body", "role": "body", "content": {"kind": "text", "text": f"a text about {word}"}}]})


def _found(searcher: LexicalSearcher, query: str) -> list[str]:
    index, layout = searcher.index(GENERATION)
    return [c.record_id for c in lexical_index.search(index, layout, "org", ["proj"], query, 10)]


def test_a_search_reads_the_commit_made_after_the_previous_search(tmp_path):
    writer = lexical_index.LexicalWriter(generations.index_path(tmp_path, generations.LEXICAL, GENERATION))
    writer.add_version("org", "proj", DEFAULT_RETRIEVAL, _version(1, "herons"))
    writer.commit(1)
    searcher = LexicalSearcher(tmp_path)
    assert _found(searcher, "herons") == ["rec_1"]

    for position, word in enumerate(["egrets", "storks", "ibises"], start=2):
        writer.add_version("org", "proj", DEFAULT_RETRIEVAL, _version(position, word))
        writer.commit(position)
        assert _found(searcher, word) == [f"rec_{position}"]  # the very next search, no notice
    writer.remove_record("rec_1")
    writer.commit(5)
    assert _found(searcher, "herons") == []
    writer.close()


def test_a_generation_without_files_is_an_error_not_empty_hits(tmp_path):
    with pytest.raises(ApiError) as raised:
        LexicalSearcher(tmp_path).index(GENERATION)
    assert raised.value.status == 503
