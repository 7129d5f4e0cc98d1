"""A lexical index after a crash in the middle of a commit (design.md: nothing lost on a crash;
decisions.md "Process lifecycle"): the writer that reopens it commits again."""

from __future__ import annotations

import msgspec

from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL
from contentsvc.search import lexical_index
from contentsvc.search.lexical_index import LexicalWriter
from tests.unit.test_retrieval import PAYLOAD


def _version(n: int):
    return msgspec.structs.replace(PAYLOAD, record_id=f"rec_{n}", version_id=f"ver_{n}")


def _withdraw_and_commit(path, position: int) -> None:
    writer = LexicalWriter(path)
    writer.remove_record("rec_1")
    writer.commit(position)
    writer.close()


def test_a_commit_cut_short_leaves_no_file_that_stops_the_next_one(tmp_path):
    # A commit writes its files (here the deletes of a segment, `<segment>.<opstamp>.del`), then
    # meta.json. Killed in between, the files stay but meta.json still names the commit before:
    # the reopened writer replays the same operations to the same opstamp, and found its file
    # there (FileAlreadyExists, on every restart) unless the files no commit uses are cleared.
    writer = LexicalWriter(tmp_path)
    for n in range(3):
        writer.add_version("org", "proj", DEFAULT_RETRIEVAL, _version(n))
    writer.commit(1)
    writer.close()
    del writer
    committed = (tmp_path / "meta.json").read_bytes()
    _withdraw_and_commit(tmp_path, 2)
    assert any(p.suffix == ".del" for p in tmp_path.iterdir())
    (tmp_path / "meta.json").write_bytes(committed)  # as if killed before meta.json was written

    _withdraw_and_commit(tmp_path, 2)  # the same work again, after the restart

    index, layout = lexical_index.open_index(tmp_path)
    index.reload()
    found = {c.record_id for c in lexical_index.search(index, layout, "org", ["proj"], "body", 10)}
    assert found == {"rec_0", "rec_2"}
    assert LexicalWriter(tmp_path).checkpoint() == 2
