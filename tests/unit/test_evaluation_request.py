"""The subscription request builder and answer checks (part 2 "Plugin protocol" > Subscription
request / response; decisions-part2 "Evaluation trigger and eligibility")."""

from __future__ import annotations

import hashlib

import pytest

from contentsvc.monitoring.evaluation_request import (
    Evaluation,
    InvalidOutput,
    RecordVersion,
    batches,
    checked_decisions,
    deduplicated,
    fingerprint,
    idempotency_key,
    record_object,
    subscription_request,
)


def version(**extra) -> RecordVersion:
    manifest = {"parts": [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": "Harbour"}},
        {"key": "scan", "role": "body", "content": {"kind": "blob", "blob_id": "blob_1", "media_type": "image/png"}},
        {"key": "body", "role": "body", "content": {"kind": "text", "text": "Cranes"}},
    ]}
    return RecordVersion(corpus_id="c1", record_id="rec_1", record_version_id="ver_1", namespace="ns",
                         record_key="k1", accepted_at="2026-01-01T00:00:00Z", manifest=manifest,
                         provenance={"origin": "connector", "producer": "rss", "producer_version": "1.0",
                                     "connector": "con_1"}, **extra)


def test_record_object():
    # part 2 Subscription request `record`: text Parts only, manifest order; provenance with normalization
    record = record_object(version(position="7"), enriched=False, normalization="pdf")
    assert record == {
        "corpus_id": "c1", "record_id": "rec_1", "record_version_id": "ver_1", "enriched": False,
        "parts": [{"key": "title", "role": "title", "text": "Harbour"}, {"key": "body", "role": "body", "text": "Cranes"}],
        "source": {"namespace": "ns", "record_key": "k1", "position": "7"}, "accepted_at": "2026-01-01T00:00:00Z",
        "provenance": {"origin": "connector", "producer": "rss", "producer_version": "1.0", "connector": "con_1",
                       "normalization": "pdf"},
        "extensions": {}}
    assert record_object(version(), enriched=True)["provenance"]["normalization"] == "builtin"
    assert "position" not in record_object(version(), enriched=True)["source"]


def test_part_limit():
    # part 2 Limits: record parts at most 256
    manifest = {"parts": [{"key": f"p{n}", "role": "body", "content": {"kind": "text", "text": "x"}} for n in range(300)]}
    many = RecordVersion("c", "r", "v", "n", "k", "2026-01-01T00:00:00Z", manifest, {})
    assert len(record_object(many, enriched=False)["parts"]) == 256


def test_ids_dedup_batches_and_key():
    # decisions-part2: identical pairs deduplicated, split at max_batch_size, ids e1.., key from fingerprints
    a = Evaluation({"contains": "x"}, {}, ({"subscription_id": "sub_1"},))
    b = Evaluation({"contains": "x"}, {}, ({"subscription_id": "sub_2"},))
    c = Evaluation({"contains": "y"}, {"label": "l"})
    merged = deduplicated([a, b, c])
    assert len(merged) == 2 and merged[0].subscriptions == ({"subscription_id": "sub_1"}, {"subscription_id": "sub_2"})
    assert [len(batch) for batch in batches(merged * 3, 4)] == [4, 2]
    request = subscription_request("inv_1", "org", {"record_version_id": "ver_1", "parts": []}, merged, {"k": 1})
    assert [e["id"] for e in request["evaluations"]] == ["e1", "e2"]
    assert request["contribution"] == "subscription" and request["configuration"] == {"k": 1}
    expected = hashlib.sha256(b"ver_1" + b"".join(b"\n" + fp.encode() for fp in sorted(
        [fingerprint({"contains": "x"}, {}), fingerprint({"contains": "y"}, {"label": "l"})]))).hexdigest()
    assert request["idempotency_key"] == expected == idempotency_key("ver_1", list(reversed(merged)))
    assert fingerprint({"a": 1, "b": 2}, {}) == fingerprint({"b": 2, "a": 1}, {})


REQUEST = {"record": {"parts": [{"key": "body", "role": "body", "text": "t"}]},
           "evaluations": [{"id": "e1"}, {"id": "e2"}]}


def test_checked_decisions():
    answer = {"decisions": [{"id": "e2", "decision": "no_match"},
                            {"id": "e1", "decision": "match", "evidence": {"explanation": "x", "part_keys": ["body"]}}]}
    assert checked_decisions(answer, REQUEST) == {
        "e1": {"decision": "match", "evidence": {"explanation": "x", "part_keys": ["body"], "details": {}}},
        "e2": {"decision": "no_match"}}


@pytest.mark.parametrize("decisions", [
    [{"id": "e1", "decision": "match"}, {"id": "e2", "decision": "no_match"}],  # match without evidence
    [{"id": "e1", "decision": "match", "evidence": {"explanation": "x", "part_keys": ["nope"]}},
     {"id": "e2", "decision": "no_match"}],  # unknown part key
    [{"id": "e1", "decision": "no_match"}],  # missing id
    [{"id": "e1", "decision": "no_match"}, {"id": "e9", "decision": "no_match"}],  # unknown id
    [{"id": "e1", "decision": "maybe"}, {"id": "e2", "decision": "no_match"}],
    [{"id": "e1", "decision": "match", "evidence": {"explanation": "x", "details": {"d": "x" * 17000}}},
     {"id": "e2", "decision": "no_match"}],  # oversize details
])
def test_invalid_output(decisions):
    # decisions-part2: match without evidence, unknown part_keys, unknown or missing id, oversize
    with pytest.raises(InvalidOutput):
        checked_decisions({"decisions": decisions}, REQUEST)
