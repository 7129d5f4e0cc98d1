"""The pure rules of the connectors slice: health precedence (part 2 "Connector health and push"),
fetch-answer checks and items as commands (decisions-part2 "Runs"), the fixture kind's pages, and
the push guards (decisions-part2 "Push routes, relay, push_policy, proxies")."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contentsvc.connectors.commands import item_commands
from contentsvc.connectors.health import STATES, Facts, health_of, moved, state_of
from contentsvc.connectors.kinds import FIXTURE_KIND, ServedKind
from contentsvc.connectors.push_routes import relayed_response
from contentsvc.connectors.pages import RunFailure, check_page, fixture_fetch, item_command
from contentsvc.connectors.push_guards import (
    MAX_RELAYED_HEADERS,
    TokenBucket,
    check_allowed,
    check_signature,
    client_address,
    relayed_headers,
    resolve_route,
)
from contentsvc.domain.errors import ApiError
from contentsvc.domain.models import BlobContent, IngestCommand, Part, WithdrawalCommand
from contentsvc.plugins.manifest import PushRoute

NOW = datetime(2026, 3, 5, 12, 0, tzinfo=timezone.utc)


def facts(**changes) -> Facts:
    base = dict(enabled=True, created_at=NOW - timedelta(hours=1), last_item_at=None, last_success_at=None,
                last_error=None, credential_expires_at=None, silent_after_seconds=86400,
                credential_warning_seconds=604800, usage_day=None, items_read_today=0, items_read_previous_day=0,
                diagnostics={}, push=None)
    return Facts(**{**base, **changes})


@given(enabled=st.booleans(), access=st.booleans(), push_access=st.booleans(), expiring=st.booleans(),
       silent=st.booleans())
def test_health_states_follow_the_contract_precedence(enabled, access, push_access, expiring, silent):
    # part 2 "Connector health and push": disabled > access_error > credential_expiring > silent > active
    f = facts(enabled=enabled,
              last_error={"code": "http_401", "at": "x", "error_class": "access"} if access else None,
              push={"state": "failed", "error": {"class": "access"}} if push_access else {"state": "active"},
              credential_expires_at=NOW + timedelta(days=1) if expiring else NOW + timedelta(days=60),
              created_at=NOW - timedelta(days=2) if silent else NOW - timedelta(minutes=5))
    expected = ("disabled" if not enabled else "access_error" if access or push_access
                else "credential_expiring" if expiring else "silent" if silent else "active")
    assert state_of(f, NOW) == expected and expected in STATES


def test_other_failures_show_only_as_last_error_and_usage_rolls_over_at_the_utc_day():
    f = facts(last_error={"code": "http_404", "at": "2026-03-05T11:00:00Z", "error_class": "source"},
              usage_day=(NOW - timedelta(days=1)).date(), items_read_today=7, items_read_previous_day=3)
    health = health_of(f, NOW)
    assert health["state"] == "active" and health["last_error"] == {"code": "http_404", "at": "2026-03-05T11:00:00Z"}
    assert health["usage"] == {"day": "2026-03-05", "items_read": 0, "previous_day_items_read": 7}
    assert moved({"state": "active"}, {"state": "silent"}) and not moved({"state": "active"}, {"state": "active"})
    assert moved({"state": "active", "push": {"state": "pending"}}, {"state": "active", "push": {"state": "active"}})


def item(key="k", revision="r1", **extra) -> dict:
    return {"record_key": key, "revision": revision, "content": {"kind": "text", "text": "hello"}, **extra}


def test_a_fetch_answer_breaking_the_protocol_fails_the_run():
    # decisions-part2 "Runs": checkpoint_too_large, checkpoint_not_advanced, invalid_plugin_output
    with pytest.raises(RunFailure) as failure:
        check_page({"items": []}, None, 10, 1024)
    assert failure.value.code == "invalid_plugin_output"
    with pytest.raises(RunFailure) as failure:
        check_page({"items": [], "checkpoint": {"pad": "x" * 2000}}, None, 10, 1024)
    assert failure.value.code == "checkpoint_too_large"
    with pytest.raises(RunFailure) as failure:
        check_page({"items": [], "checkpoint": {"a": 1}, "more": True}, {"a": 1}, 10, 1024)
    assert failure.value.code == "checkpoint_not_advanced"
    with pytest.raises(RunFailure):
        check_page({"items": [item()] * 11, "checkpoint": 1}, None, 10, 1024)  # over the kind's max_items


def test_a_fetch_answer_holding_u0000_where_it_is_stored_fails_the_run():
    # docs/decisions.md: no stored text holds U+0000; the checkpoint, notice and push state are stored
    for answer in ({"items": [], "checkpoint": {"seen": {"a\x00b": "1"}}},
                   {"items": [], "checkpoint": 1, "notice": "\x00"},
                   {"items": [], "checkpoint": 1, "push": {"state": "failed", "code": "x\x00"}}):
        with pytest.raises(RunFailure) as failure:
            check_page(answer, None, 10, 1024)
        assert failure.value.code == "invalid_plugin_output", answer
    # A member whose name holds it: the run's stored error names it with U+FFFD.
    with pytest.raises(RunFailure) as failure:
        check_page({"items": [], "checkpoint": {"k\x00": 1}}, None, 10, 1024)
    assert "\x00" not in failure.value.message and "/checkpoint/k\ufffd" in failure.value.message
    # Diagnostics are only shown: left out, as oversized ones are. An item's U+0000 is its own refusal.
    page = check_page({"items": [item(key="k\x00")], "checkpoint": 1, "diagnostics": {"d": "\x00"}}, None, 10, 1024)
    assert page.diagnostics is None and len(page.items) == 1
    connector = {"connector_id": "con_1", "corpus_id": "news", "source_namespace": "feed"}
    commands = item_commands(ServedKind(FIXTURE_KIND, None), connector,
                             [item(), item(key="k\x00"), item(content={"kind": "text", "text": "a \x00 b"})])
    assert isinstance(commands[0], IngestCommand)
    assert [(c.status, c.code) for c in commands[1:]] == [(422, "item_rejected")] * 2


def test_not_due_keeps_the_checkpoint_and_bad_items_are_rejected_one_by_one():
    page = check_page({"items": [item()], "checkpoint": {"b": 2}, "not_due": True}, {"a": 1}, 10, 1024)
    assert page.not_due and page.checkpoint == {"a": 1} and not page.more
    page = check_page({"items": [item(), {"record_key": ""}, item(key="x" * 1025)], "checkpoint": 1,
                       "reads": 2, "retry_after_seconds": 30, "unknown": True}, None, 10, 1024)
    assert page.rejected == [1, 2] and page.reads == 2 and page.retry_after_seconds == 30


def test_an_item_with_a_malformed_attachment_is_rejected_alone():
    # part 2 fetch response: attachments (max 64) of {key 1..256, parent_key, role 1..64, media_type, ref 1..1024}
    good = {"key": "notes", "role": "attachment", "media_type": "text/markdown", "ref": "n1"}
    page = check_page({"items": [item(attachments=[good]), item(attachments=[{**good, "key": ""}]),
                                 item(attachments=[{k: v for k, v in good.items() if k != "ref"}]),
                                 item(attachments=[good] * 65)], "checkpoint": 1}, None, 10, 1024)
    assert page.rejected == [1, 2, 3]


def test_attachments_follow_the_item_parts_as_blob_parts():
    connector = {"connector_id": "con_1", "corpus_id": "news", "source_namespace": "feed"}
    blob = Part(key="notes", role="attachment", content=BlobContent(blob_id="blob_1", media_type="text/markdown"),
                parent_key="body")
    cmd = item_command(connector, "papers", "1.0.0", item(), [blob])
    assert [(p.key, type(p.content).__name__) for p in cmd.content.parts] == [("body", "TextContent"),
                                                                              ("notes", "BlobContent")]


def test_items_become_the_commands_a_client_would_send():
    # decisions-part2 "Runs": key con:{connector_id}:{record_key}:{revision}; provenance origin connector
    connector = {"connector_id": "con_1", "corpus_id": "news", "source_namespace": "feed"}
    cmd = item_command(connector, "rss", "0.1.0", item())
    assert isinstance(cmd, IngestCommand) and cmd.idempotency_key == "con:con_1:k:r1"
    assert (cmd.provenance.origin, cmd.provenance.producer, cmd.provenance.connector) == ("connector", "rss", "con_1")
    withdrawal = item_command(connector, "rss", None, {"record_key": "k", "revision": "r2", "withdraw": True})
    assert isinstance(withdrawal, WithdrawalCommand) and withdrawal.idempotency_key == "con:con_1:k:r2:withdraw"
    with pytest.raises(msgspec.ValidationError):  # connector items carry text, never Blobs
        item_command(connector, "rss", None, item(content={"kind": "blob", "blob_id": "b", "media_type": "x/y"}))


@given(total=st.integers(0, 30), size=st.integers(1, 7))
def test_the_fixture_kind_reads_every_item_once_in_pages(total, size):
    # decisions-part2 "Built-in `fixture` kind": checkpoint {offset}, pages of page_size while more
    config = {"items": [{"record_key": f"k{n}", "revision": "1", "text": "t"} for n in range(total)],
              "page_size": size}
    seen, checkpoint, more = [], None, True
    while more:
        page = fixture_fetch(config, checkpoint)
        seen += [i["record_key"] for i in page["items"]]
        assert page["checkpoint"] != checkpoint or not page["more"]
        checkpoint, more = page["checkpoint"], page["more"]
    assert seen == [f"k{n}" for n in range(total)]


addresses = st.ip_addresses(v=4).map(str)


@given(hops=st.lists(addresses, min_size=1, max_size=5), client=addresses)
def test_forwarded_for_is_read_right_to_left_past_trusted_proxies_only(hops, client):
    trusted = ["10.0.0.0/8"]
    proxies = [f"10.0.0.{n + 1}" for n in range(3)]
    chain = ", ".join(hops + [client] + proxies[:-1])
    # A trusted peer: the first untrusted address from the right is the client.
    expected = client if not client.startswith("10.") else next(
        (h for h in reversed(hops) if not h.startswith("10.")), hops[0])
    assert client_address(proxies[-1], chain, trusted) == expected
    # An untrusted peer's X-Forwarded-For is ignored.
    assert client_address("192.0.2.7", chain, trusted) == "192.0.2.7"


@given(rate=st.floats(0.1, 50), burst=st.integers(1, 20), gaps=st.lists(st.floats(0, 2), max_size=60))
def test_the_token_bucket_never_exceeds_its_burst_and_refills_at_its_rate(rate, burst, gaps):
    bucket, now, taken = TokenBucket(rate, burst), 0.0, 0
    for gap in gaps:
        now += gap
        if bucket.take(now) is None:
            taken += 1
    assert taken <= burst + rate * now + 1e-6


def test_relayed_headers_drop_credentials_and_hop_by_hop_and_keep_64():
    headers = [("Authorization", "x"), ("Cookie", "y"), ("Proxy-Foo", "z"), ("Connection", "close"),
               ("X-Hub-Signature-256", "sha256=1")] + [(f"X-N{n}", str(n)) for n in range(100)]
    relayed = relayed_headers(headers)
    assert len(relayed) == MAX_RELAYED_HEADERS and list(relayed)[0] == "x-hub-signature-256"
    assert not {"authorization", "cookie", "proxy-foo", "connection"} & set(relayed)


def test_a_plugins_relayed_response_is_sent_only_as_a_server_can_write_it():
    # decisions-part2 receive response {response {status (2xx), headers, body_base64}}: what the API
    # answers the source with; framing headers are the server's own, and an unwritable one is refused
    # (_receive answers 503 plugin_unavailable) rather than failing inside the server.
    assert relayed_response(None) == (200, {}, b"")
    assert relayed_response({"status": 201, "headers": {"Content-Type": "text/plain", "Content-Length": "99",
                                                        "X-Count": 3}, "body_base64": "aGk="}) == \
        (201, {"content-type": "text/plain"}, b"hi")
    assert relayed_response({"status": 500})[0] == 200
    for unwritable in ([], {"headers": ["x-a"]}, {"headers": {"x-a": "1\r\nx-b: 2"}}, {"headers": {"x a": "1"}},
                       {"headers": {"x-a": "\x00"}}, {"body_base64": "not base64!"}, {"body_base64": 7}):
        assert relayed_response(unwritable) is None, unwritable


def test_routes_resolve_by_template_and_method():
    routes = [PushRoute(name="items", path="lists/{list}/items", methods=["POST", "PUT"], auth="service_key",
                        request_schema={})]
    assert resolve_route(routes, "lists/harbour/items", "POST").name == "items"
    with pytest.raises(ApiError) as refused:
        resolve_route(routes, "lists/harbour/items", "DELETE")
    assert refused.value.status == 405 and refused.value.headers["Allow"] == "POST, PUT"
    with pytest.raises(ApiError) as refused:
        resolve_route(routes, "lists/a/b/items", "POST")
    assert refused.value.status == 404


def test_address_and_signature_guards():
    check_allowed("10.1.2.3", ["10.0.0.0/8"])
    check_allowed("2001:db8::1", None)
    with pytest.raises(ApiError) as refused:
        check_allowed("192.0.2.1", ["10.0.0.0/8", "2001:db8::/32"])
    assert refused.value.code == "ip_not_allowed"
    route = PushRoute(name="s", path="s", methods=["POST"], auth="signature", request_schema={},
                      signature_header="X-Sig", timestamp_header="X-Ts", window_seconds=300)
    assert check_signature({"x-sig": "abc", "x-ts": "1000"}, route, 1200) == "abc"
    for headers in ({"x-ts": "1000"}, {"x-sig": "abc", "x-ts": "1"}, {"x-sig": "abc"}):
        with pytest.raises(ApiError) as refused:
            check_signature(headers, route, 1200)
        assert refused.value.code == "invalid_signature"
