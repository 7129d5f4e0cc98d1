"""Webhook bytes and signing (decisions-part2, "WebhookEvent and signing"), checked against the
Standard Webhooks reference implementation; and the retry schedule (decisions-part2, "Deliveries")."""

from __future__ import annotations

import base64
import json
import random
import time
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest
from hypothesis import given, settings, strategies as st
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from contentsvc.config.settings import DeliverySettings, DestinationSettings
from contentsvc.monitoring.deliveries import excerpt, next_delay, retry_after_seconds
from contentsvc.monitoring.webhooks import USER_AGENT, WebhookEvent, request_headers, webhook_body

ORDER = ["event_id", "type", "created_at", "subscription_id", "subscription_version_id", "saved_query_id",
         "saved_query_version_id", "match_id", "corpus_id", "record_id", "version_id", "owner"]


def secret_of(raw: bytes) -> str:
    return "whsec_" + base64.b64encode(raw).decode()


def event(owner=None, **overrides) -> WebhookEvent:
    fields = {name: f"{name}-value" for name in ORDER[:-1]}
    fields.update(event_id="wev_01J0000000000000000000000", type="match.created",
                  created_at="2025-01-02T03:04:05.123456Z")
    fields.update(overrides)
    if owner is not None:
        fields["owner"] = owner
    return WebhookEvent(**fields)


def test_body_is_compact_json_in_the_contract_order():
    # decisions-part2 "WebhookEvent and signing": compact JSON, members in this order; owner only when set
    body = webhook_body(event(owner="user-7"))
    assert list(json.loads(body)) == ORDER
    assert b" " not in body.replace(b"-value", b"")
    assert "owner" not in json.loads(webhook_body(event()))
    assert webhook_body(event()) == webhook_body(event())  # byte-identical rebuilds


def test_headers_carry_id_timestamp_signature_and_destination_headers():
    # decisions-part2 "WebhookEvent and signing": headers and their order of authority
    destination = DestinationSettings(url="http://127.0.0.1:1/hook", secret=secret_of(b"k" * 32),
                                      headers={"x-tenant": "t1"})
    body = webhook_body(event())
    headers = request_headers(destination, "wev_X", 1_700_000_000, body)
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == USER_AGENT and USER_AGENT.startswith("contentsvc-webhooks/")
    assert headers["x-tenant"] == "t1"
    assert headers["webhook-id"] == "wev_X" and headers["webhook-timestamp"] == "1700000000"
    assert headers["webhook-signature"].startswith("v1,") and " " not in headers["webhook-signature"]


secrets = st.binary(min_size=24, max_size=64)
bodies = st.text(max_size=300)


@settings(max_examples=60, deadline=None)
@given(current=secrets, previous=secrets, owner=st.one_of(st.none(), st.text(min_size=1, max_size=128)),
       record_id=bodies)
def test_the_reference_implementation_verifies_both_signatures(current, previous, owner, record_id):
    # part2 Events: Standard Webhooks v1 HMAC-SHA256 over id.timestamp.body;
    # decisions-part2: with previous_secret a second v1 signature follows after one space
    destination = DestinationSettings(url="https://example.test/hook", secret=secret_of(current),
                                      previous_secret=secret_of(previous))
    body = webhook_body(event(owner=owner, record_id=record_id))
    headers = request_headers(destination, "wev_ABC", int(time.time()), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (destination.secret, destination.previous_secret):
        assert Webhook(secret).verify(body, headers)["record_id"] == record_id
    other = secret_of(bytes(b ^ 0xFF for b in current))
    if other not in (destination.secret, destination.previous_secret):
        with pytest.raises(WebhookVerificationError):
            Webhook(other).verify(body, headers)


@settings(max_examples=30, deadline=None)
@given(raw=secrets, tampered=st.sampled_from(["id", "timestamp", "body"]))
def test_any_change_to_id_timestamp_or_body_breaks_the_signature(raw, tampered):
    destination = DestinationSettings(url="https://example.test/hook", secret=secret_of(raw))
    body = webhook_body(event())
    now = int(time.time())
    headers = request_headers(destination, "wev_ABC", now, body)
    if tampered == "id":
        headers["webhook-id"] = "wev_ABD"
    elif tampered == "timestamp":
        headers["webhook-timestamp"] = str(now - 1)
    else:
        body = body.replace(b"match.created", b"match.withdrawn")
    with pytest.raises(WebhookVerificationError):
        Webhook(destination.secret).verify(body, headers)


def test_schedule_first_delay_is_never_jittered_and_later_ones_stay_within_jitter():
    # decisions-part2 "Startup configuration" [deliveries]: each delay ×U(0.9,1.1); the first, 0, has none
    config = DeliverySettings(retry_schedule=[0, 10, 100], jitter=0.1)
    rng = random.Random(7)
    for _ in range(200):
        assert 9.0 <= next_delay(config, 1, None, rng) <= 11.0
        assert 90.0 <= next_delay(config, 2, None, rng) <= 110.0
    assert next_delay(DeliverySettings(retry_schedule=[5, 0], jitter=0.5), 1, None) == 0.0


def test_retry_after_raises_the_delay_up_to_the_cap():
    # decisions-part2 "Deliveries": Retry-After raises the next delay, capped at max_retry_after_seconds
    config = DeliverySettings(retry_schedule=[0, 10], jitter=0, max_retry_after_seconds=60)
    assert next_delay(config, 1, 30.0) == 30.0
    assert next_delay(config, 1, 5.0) == 10.0  # raises, never lowers
    assert next_delay(config, 1, 3600.0) == 60.0


def test_retry_after_reads_seconds_and_http_dates():
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert retry_after_seconds("120", now) == 120.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=90), usegmt=True), now) == 0.0
    assert retry_after_seconds("soon", now) is None and retry_after_seconds(None, now) is None


@given(st.binary(max_size=2000))
def test_response_excerpt_is_the_first_512_bytes_decoded_with_replacement(body):
    # decisions-part2 "Deliveries": response_excerpt; docs/decisions.md: a NUL, which a PostgreSQL text
    # cannot hold, is replaced like an undecodable byte
    assert excerpt(body) == body[:512].decode("utf-8", errors="replace").replace("\x00", "\ufffd")
