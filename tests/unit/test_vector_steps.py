"""How the vectors fold bounds a step by the texts it embeds (projectors/vectors.py
_within_step): under a burst of ingests it rests after every step, so a step must be short for
the rests to pace it (docs/decisions.md, "Folds rest in bursts of ingests")."""

from datetime import datetime, timezone

from hypothesis import given
from hypothesis import strategies as st

from contentsvc.journal import events as ev
from contentsvc.journal.events import JournalEvent, RecordAccepted, RecordWithdrawn, Source
from contentsvc.projectors.vectors import TEXTS_PER_STEP, VectorProjector, embedding_inputs

WITH_SPACE = ("org_a", "crp_vec")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _event(position: int, kind: str, corpus: str, texts: int, quarantined: bool) -> JournalEvent:
    source = Source(corpus_id=corpus, namespace="n", record_key=f"k{position}")
    if kind == ev.RECORD_WITHDRAWN:
        payload = RecordWithdrawn(record_id=f"rec_{position}", source=source, withdrawn_at="2026-01-01T00:00:00Z")
    else:
        parts = [{"key": f"p{i}", "role": "body", "content": {"kind": "text", "text": f"text {i}"}}
                 for i in range(texts)]
        payload = RecordAccepted(record_id=f"rec_{position}", version_id=f"ver_{position}",
                                 receipt_id=f"rcp_{position}", source=source, manifest={"parts": parts}, provenance={},
                                 accepted_at="2026-01-01T00:00:00Z", created_at="2026-01-01T00:00:00Z",
                                 quarantined=quarantined)
    return JournalEvent(position=position, event_id=f"evt_{position}", kind=kind, public=True, org_id="org_a",
                        corpus_id=corpus, subject_type="record", subject_id=f"rec_{position}", version_id=None,
                        receipt_id=None, payload=payload, committed_at=NOW)


def _texts(events: list[JournalEvent]) -> int:
    """The texts the fold embeds for these events (every accepted, servable Version in the space)."""
    return sum(len(embedding_inputs(e.payload.manifest)) for e in events
               if e.kind == ev.RECORD_ACCEPTED and not e.payload.quarantined and e.corpus_id == WITH_SPACE[1])


batches = st.lists(st.tuples(st.integers(1, 5),  # gap to the previous position (other folds' kinds between)
                             st.sampled_from([ev.RECORD_ACCEPTED, ev.RECORD_WITHDRAWN]),
                             st.sampled_from([WITH_SPACE[1], "crp_plain"]),
                             st.integers(1, 2 * TEXTS_PER_STEP), st.booleans()), min_size=1, max_size=40)


@given(batches, st.integers(0, 5))
def test_a_step_embeds_at_most_its_texts_and_reaches_just_before_the_next_event(batch, tail):
    positions, position = [], 0
    for gap, *_ in batch:
        position += gap
        positions.append(position)
    events = [_event(p, kind, corpus, texts, quarantined)
              for p, (_, kind, corpus, texts, quarantined) in zip(positions, batch)]
    through = positions[-1] + tail  # a batch's last position may lie past its last event

    kept, reached = VectorProjector._within_step(events, through, {WITH_SPACE})

    assert kept == events[:len(kept)] and kept  # a prefix, never empty: every step moves on
    assert kept[-1].position <= reached <= through
    # At most TEXTS_PER_STEP texts, unless the first event alone holds more (it is folded alone).
    assert _texts(kept) <= max(TEXTS_PER_STEP, _texts(events[:1]))
    if len(kept) < len(events):  # cut: the next step starts with the event that did not fit
        following = events[len(kept)]
        assert reached == following.position - 1
        assert _texts(kept) + _texts([following]) > TEXTS_PER_STEP
    else:
        assert reached == through


def test_a_burst_of_long_records_is_embedded_a_few_at_a_time():
    events = [_event(p, ev.RECORD_ACCEPTED, WITH_SPACE[1], 4, False) for p in range(1, 101)]

    kept, reached = VectorProjector._within_step(events, 100, {WITH_SPACE})

    assert len(kept) == TEXTS_PER_STEP // 4 and reached == kept[-1].position


def test_records_outside_the_space_do_not_shorten_a_step():
    events = [_event(p, ev.RECORD_ACCEPTED, "crp_plain", 4, False) for p in range(1, 101)]

    assert VectorProjector._within_step(events, 120, {WITH_SPACE}) == (events, 120)
