"""Which replaced Versions the lexical projector finds to retire, read from a real Tantivy index
(projectors/currentness.py: a replaced Version's documents leave the index once the read model
shows its successor current, or its Record withdrawn)."""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings, strategies as st

from contentsvc.domain.retrieval import DEFAULT_RETRIEVAL
from contentsvc.search.lexical_index import SEGMENT_CHARS, LexicalWriter
from tests.unit.test_retrieval import PAYLOAD


def _version(record: int, version: int, long: bool):
    text = ("word " * (SEGMENT_CHARS // 2)) if long else f"text of {record} {version}"  # several segments
    return msgspec.structs.replace(PAYLOAD, record_id=f"rec_{record}", version_id=f"ver_{record}_{version}",
                                   manifest={"parts": [{"key": "body", "role": "body",
                                                        "content": {"kind": "text", "text": text}}]})


# Per indexed Version: its Record, its number, whether its text is long, and how many projection
# generations of the Corpus hold it.
INDEXED = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans(), st.integers(1, 2)),
                   max_size=20, unique_by=lambda v: v[:2])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(indexed=INDEXED, current=st.dictionaries(st.integers(0, 6), st.integers(0, 4), max_size=7))
def test_the_versions_found_to_retire_are_every_indexed_one_but_the_current(tmp_path_factory, indexed, current):
    writer = LexicalWriter(tmp_path_factory.mktemp("index"))
    for record, version, long, projections in indexed:
        for p in range(projections):
            writer.add_version("org_1", f"proj_{p}", DEFAULT_RETRIEVAL, _version(record, version, long))
    writer.commit(1)
    asked = {f"rec_{r}": f"ver_{r}_{v}" for r, v in current.items()}  # the current one may not be indexed (withdrawn)
    expected = {f"ver_{r}_{v}" for r, v, _, _ in indexed if r in current and v != current[r]}
    assert writer.replaced_versions(asked) == expected
    writer.close()


def test_a_record_new_to_the_index_has_nothing_to_retire(tmp_path):
    writer = LexicalWriter(tmp_path)
    writer.add_version("org_1", "proj_0", DEFAULT_RETRIEVAL, _version(1, 0, long=True))
    writer.commit(1)
    assert writer.replaced_versions({"rec_1": "ver_1_0", "rec_2": "ver_2_0"}) == set()
    writer.close()
