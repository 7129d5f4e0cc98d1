"""An invalidation is never ahead of the state it invalidates (part1 rule 18: reread current state).

The feed publishes an event only once the read model has folded it, so a
client that rereads on `receipt.resolved` finds the Receipt resolved.
"""

import time

from tests.conftest import create_corpus, text_command


def test_reread_after_an_event_sees_its_effect(api):
    corpus = create_corpus(api)
    cursor = api.get("/v0/changes", params={"corpus_id": corpus}).json()["next_cursor"]
    receipts = set()
    for i in range(10):
        entries = [text_command(corpus, f"k{i}-{j}", f"text {i} {j}") for j in range(10)]
        for item in api.post("/v0/records/batch", json={"entries": entries}).json()["items"]:
            receipts.add(item["receipt"]["receipt_id"])
    resolved_seen = set()
    deadline = time.time() + 30
    while resolved_seen != receipts and time.time() < deadline:
        page = api.get("/v0/changes", params={"corpus_id": corpus, "cursor": cursor}).json()
        cursor = page["next_cursor"]
        for event in page["items"]:
            if event["kind"] == "receipt.resolved":
                receipt = api.get(f"/v0/ingestion-receipts/{event['receipt_id']}").json()
                assert receipt["state"] == "resolved", receipt
                resolved_seen.add(event["receipt_id"])
            if event["kind"] == "record.accepted":
                record = api.get(f"/v0/records/{event['subject']['id']}")
                assert record.status_code == 200
    assert resolved_seen == receipts
