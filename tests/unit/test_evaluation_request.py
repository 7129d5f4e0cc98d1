"""The subscription request builder, and the answer checks as a preview meets them (part 2 "Plugin protocol" > Subscription
request / response; decisions-part2 "Evaluation trigger and eligibility")."""

from __future__ import annotations

import pytest

from contentsvc.monitoring.batches import InvalidOutput, check_answer, part_keys, preview_batch, subscription_request
from contentsvc.monitoring.evaluation_request import RecordVersion, record_object


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


def test_the_request_carries_the_batch_and_both_configurations():
    # part 2 Subscription request: record, evaluations (ids e1..), the plugin's configuration
    record = record_object(version(), enriched=False)
    batch = preview_batch("ver_1", {"contains": "x"}, {"label": "l"})
    request = subscription_request("inv_1", "org", record, batch, {"k": 1})
    assert request["idempotency_key"] == batch.idempotency_key and request["evaluations"] == batch.evaluations
    assert [e["id"] for e in request["evaluations"]] == ["e1"] and request["evaluations"][0]["subscriptions"] == []
    assert request["contribution"] == "subscription" and request["configuration"] == {"k": 1}
    assert part_keys(record) == {"title", "body"}


REQUEST_PARTS = {"body"}


def test_checked_decisions():
    answer = {"decisions": [{"id": "e2", "decision": "no_match"},
                            {"id": "e1", "decision": "match", "evidence": {"explanation": "x", "part_keys": ["body"]}}]}
    assert check_answer(answer, ["e1", "e2"], REQUEST_PARTS) == {
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
    [{"id": "e1", "decision": "match", "evidence": {"explanation": "a \x00 b"}},
     {"id": "e2", "decision": "no_match"}],  # U+0000, which the Match's stored evidence cannot hold
    [{"id": "e1", "decision": "match", "evidence": {"explanation": "x", "details": {"k\x00": 1}}},
     {"id": "e2", "decision": "no_match"}],
])
def test_invalid_output(decisions):
    # decisions-part2: match without evidence, unknown part_keys, unknown or missing id, oversize;
    # docs/decisions.md: no stored text holds U+0000, the refusal's own words included
    with pytest.raises(InvalidOutput) as refusal:
        check_answer({"decisions": decisions}, ["e1", "e2"], REQUEST_PARTS)
    assert "\x00" not in str(refusal.value)
