"""How an Operation's reported moves fold (part 1, Operation state table; rules 10, 17).

The read model folds `operation.changed` events in SQL, and merges several
events for one Operation within a batch in Python (domain/operations.merge).
Both must give the same Operation, whatever the order of moves; and the
rules hold: a terminal state never changes, a cancel request is not hidden
by work reports. The activation verdict is checked on its own.
"""

from __future__ import annotations

import asyncio
import uuid

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st

from contentsvc.domain import operations as ops
from contentsvc.journal import events as ev
from contentsvc.journal.events import NewEvent
from contentsvc.readmodel.fold import fold

STATES = ["queued", "running", "cancel_requested", "succeeded", "failed", "canceled"]
moves = st.lists(
    st.fixed_dictionaries({}, optional={
        "state": st.sampled_from(STATES),
        "counters": st.fixed_dictionaries({"versions_in_scope": st.integers(0, 9),
                                           "versions_done": st.integers(0, 9)}),
        "progress": st.sampled_from([0.0, 0.5, 1.0]),
    }),
    min_size=1, max_size=8,
)


def _event(operation_id: str, moved: dict) -> NewEvent:
    return NewEvent(org_id="org_fold", corpus_id="c", subject_type="operation", subject_id=operation_id,
                    payload=ev.OperationChanged(operation=ev.OperationMoves(operation_id=operation_id, **moved)))


def _python(start: dict, sequence: list[dict]) -> dict:
    doc = start
    for moved in sequence:
        doc = ops.merge(doc, moved)
    return doc


@given(sequence=moves)
def test_merge_rules(sequence):
    start = {"operation_id": "op_x", "state": "queued", "counters": {}, "errors": []}
    doc = start
    for moved in sequence:
        after = ops.merge(doc, {"operation_id": "op_x", **moved})
        if doc["state"] in ops.TERMINAL:
            assert after == doc  # terminal sticks: a racing cancel never undoes a completion
        if doc["state"] == "cancel_requested":
            assert after["state"] in ops.TERMINAL | {"cancel_requested"}
        doc = after


@settings(max_examples=40, deadline=None)
@given(sequence=moves)
def test_sql_fold_one_by_one_equals_the_in_batch_merge(database_url, sequence):
    async def run() -> tuple[dict, dict]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            one_by_one, batched = f"op_{uuid.uuid4().hex}", f"op_{uuid.uuid4().hex}"
            start = {"state": "queued", "counters": {}, "errors": []}
            await fold(c, [_event(one_by_one, start)])
            for moved in sequence:
                await fold(c, [_event(one_by_one, moved)])
            await fold(c, [_event(batched, start)] + [_event(batched, m) for m in sequence])
            cur = await c.execute("SELECT operation_id, doc FROM operations WHERE operation_id = ANY(%s)",
                                  ([one_by_one, batched],))
            rows = dict(await cur.fetchall())
            return rows[one_by_one], rows[batched]

    sql_single, sql_batched = asyncio.run(run())
    expected = _python({"state": "queued", "counters": {}, "errors": []}, sequence)
    for doc in (sql_single, sql_batched):
        doc = {k: v for k, v in doc.items() if k != "operation_id"}
        assert doc == {k: v for k, v in expected.items() if k != "operation_id"}


def test_cutover_verdict():
    # part 1 state table: rebuilds activate in acceptance order; a generation pinned to an
    # older configuration than the effective one fails and the effective one stays.
    serving_rebuild = ops.Build(ops.PROJECTION_REBUILD, accepted_position=50, config_position=10)
    assert ops.cutover_verdict(ops.Build(ops.PROJECTION_REBUILD, 40, 10), serving_rebuild) == ops.OPERATION_SUPERSEDED
    assert ops.cutover_verdict(ops.Build(ops.PROJECTION_REBUILD, 60, 10), serving_rebuild) is None
    serving_config = ops.Build(ops.RETRIEVAL_CONFIGURATION, accepted_position=30, config_position=30)
    assert ops.cutover_verdict(ops.Build(ops.PROJECTION_REBUILD, 20, 10), serving_config) == \
        ops.CONFIGURATION_SUPERSEDED
    assert ops.cutover_verdict(ops.Build(ops.RETRIEVAL_CONFIGURATION, 25, 25), serving_config) == \
        ops.CONFIGURATION_SUPERSEDED
    assert ops.cutover_verdict(ops.Build(ops.RETRIEVAL_CONFIGURATION, 35, 35), serving_config) is None
    # A rebuild accepted before a configuration that is now in effect is pinned to the older one.
    first = ops.Build(None, 0, 0)
    assert ops.cutover_verdict(ops.Build(ops.PROJECTION_REBUILD, 5, 0), first) is None
    # Retries keep the target generation (rule 17).
    assert ops.projection_generation_for("op_01ABC") == ops.projection_generation_for("op_01ABC") == "gen_01ABC"
