"""The change feed over real HTTP: pollChanges and streamChanges (SSE).

Covers part 1 rules 18 and 19, part 1 "Events", and decisions.md
"Change feed" (ChangeEvent fields, cursor binding, retention).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import datetime
from typing import Iterator

import httpx
import psycopg

from contentsvc.auth import keys
from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, text_command, wait_resolved

EVENT_MEMBERS = {"event_id", "kind", "corpus_id", "subject", "committed_at", "version_id", "receipt_id"}
REQUIRED_MEMBERS = {"event_id", "kind", "corpus_id", "subject", "committed_at"}
PART1_KINDS = {"corpus.created", "corpus.retrieval_changed", "record.accepted", "record.availability_changed",
               "record.withdrawn", "receipt.resolved", "operation.changed"}
SUBJECT_TYPES = {"corpus", "record", "receipt", "operation", "upload", "subscription", "saved_query", "connector"}
STREAM_TIMEOUT = httpx.Timeout(10.0)


# ----------------------------------------------------------------- helpers


def _cid(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def start_now(client: httpx.Client, corpus_id: str) -> str:
    r = client.get("/v0/changes", params={"corpus_id": corpus_id})
    assert r.status_code == 200, r.text
    body = r.json()
    # part1 rule 18: without a cursor, empty items and the current position (start now).
    assert body["items"] == [] and set(body) == {"items", "next_cursor"}
    assert isinstance(body["next_cursor"], str) and body["next_cursor"]
    return body["next_cursor"]


def poll(client: httpx.Client, corpus_id: str, cursor: str, limit: int | None = None) -> dict:
    params = {"corpus_id": corpus_id, "cursor": cursor}
    if limit is not None:
        params["limit"] = limit
    r = client.get("/v0/changes", params=params)
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"items", "next_cursor"}
    return r.json()


def poll_until(client: httpx.Client, corpus_id: str, cursor: str, done, timeout: float = 20.0,
               limit: int | None = None) -> tuple[list[dict], str]:
    """Polls from cursor, accumulating events, until done(events) holds."""
    events: list[dict] = []
    deadline = time.time() + timeout
    while True:
        page = poll(client, corpus_id, cursor, limit)
        events.extend(page["items"])
        cursor = page["next_cursor"]
        if done(events):
            return events, cursor
        assert time.time() < deadline, f"feed did not deliver; got {[e['kind'] for e in events]}"
        if not page["items"]:
            time.sleep(0.05)


def resolved_all(receipt_ids):
    wanted = set(receipt_ids)
    return lambda events: wanted <= {e.get("receipt_id") for e in events if e["kind"] == "receipt.resolved"}


def assert_change_event(event: dict, corpus_id: str) -> None:
    # decisions.md Change feed: ChangeEvent {event_id, kind, corpus_id, subject: {type, id}, committed_at,
    # version_id?, receipt_id?}; ids only, never content.
    assert set(event) <= EVENT_MEMBERS, event
    assert REQUIRED_MEMBERS <= set(event), event
    assert event["event_id"].startswith("evt_")
    assert event["kind"] in PART1_KINDS
    assert event["corpus_id"] == corpus_id
    assert set(event["subject"]) == {"type", "id"} and event["subject"]["type"] in SUBJECT_TYPES
    assert event["subject"]["id"]
    datetime.fromisoformat(event["committed_at"].replace("Z", "+00:00"))  # RFC 3339


def for_receipt(events: list[dict], receipt_id: str) -> list[dict]:
    return [e for e in events if e.get("receipt_id") == receipt_id]


def cursor_position(token: str) -> int:
    """White-box: the journal position inside a change cursor (payload || 16-byte HMAC tag)."""
    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    return json.loads(raw[:-16])["pos"]


def ingest(client: httpx.Client, corpus_id: str, record_key: str, text: str) -> str:
    r = client.post("/v0/records", json=text_command(corpus_id, record_key, text))
    assert r.status_code == 202, r.text
    return r.json()["receipt_id"]


def sse_frames(response: httpx.Response) -> Iterator[dict]:
    """Parses a text/event-stream into frames {event, id?, data}."""
    frame: dict = {}
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if frame or data:
                yield {"event": frame.get("event", "message"), **{k: v for k, v in frame.items() if k != "event"},
                       "data": "\n".join(data)}
            frame, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        else:
            frame[name] = value


def open_stream(client: httpx.Client, corpus_id: str, cursor: str | None = None, last_event_id: str | None = None):
    params = {"corpus_id": corpus_id}
    if cursor is not None:
        params["cursor"] = cursor
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    return client.stream("GET", "/v0/changes/stream", params=params, headers=headers, timeout=STREAM_TIMEOUT)


def stream_error(client: httpx.Client, corpus_id: str, status: int, code: str, **kwargs) -> dict:
    """An error before headers: a plain HTTP error answer, not a stream."""
    with open_stream(client, corpus_id, **kwargs) as r:
        r.read()
        assert not r.headers["content-type"].startswith("text/event-stream")
        return assert_error(r, status, code)


def read_changes_until(frames: Iterator[dict], corpus_id: str, done, seen: dict, timeout: float = 20.0) -> str:
    """Reads frames, recording change events in seen (by event_id), until done(seen); returns the last id."""
    last_id = None
    deadline = time.time() + timeout
    for frame in frames:
        assert frame["event"] in ("change", "checkpoint"), frame
        assert frame.get("id"), frame  # part1 rule 19: every change/checkpoint frame has an id (a cursor)
        last_id = frame["id"]
        if frame["event"] == "change":
            event = json.loads(frame["data"])
            assert_change_event(event, corpus_id)
            seen.setdefault(event["event_id"], event)
        else:
            assert json.loads(frame["data"]) == {"cursor": frame["id"]}
        if done(list(seen.values())):
            return last_id
        assert time.time() < deadline, "stream did not deliver"
    raise AssertionError("stream closed")


# ----------------------------------------------------------------- poll


def until_resolved(events: list[dict]) -> list[dict]:
    """A receipt's events up to its receipt.resolved (the materializer's part of the story)."""
    kinds = [e["kind"] for e in events]
    return events[: kinds.index("receipt.resolved") + 1] if "receipt.resolved" in kinds else events


def up_to_last_resolution(events: list[dict], receipts: list[str]) -> list[dict]:
    last = max(i for i, e in enumerate(events) if e["kind"] == "receipt.resolved" and e["receipt_id"] in receipts)
    return events[: last + 1]


def test_poll_start_now_then_events_in_commit_order(api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    cursor0 = start_now(api, a)
    assert poll(api, a, cursor0)["items"] == []

    r1 = ingest(api, a, "doc", "first text")
    rb = ingest(api, b, "doc", "text in another corpus")
    events, cursor = poll_until(api, a, cursor0, resolved_all([r1]))
    created = wait_resolved(api, r1)
    other = wait_resolved(api, rb)

    # part1 rule 18: events after the cursor, in commit order, ChangeEvent fields as decisions.md.
    # (Search availability moves, building_baseline and retrieval_ready, follow the resolution.)
    mine = until_resolved(for_receipt(events, r1))
    assert [e["kind"] for e in mine] == ["record.accepted", "record.availability_changed", "receipt.resolved"]
    rec, ver = created["record_id"], created["version_id"]
    assert mine[0]["subject"] == {"type": "record", "id": rec} and mine[0]["version_id"] == ver
    assert mine[1]["subject"] == {"type": "record", "id": rec} and mine[1]["version_id"] == ver
    assert mine[2]["subject"] == {"type": "receipt", "id": r1} and mine[2]["version_id"] == ver
    assert all(e["receipt_id"] == r1 for e in mine)

    # Correction: a new Version, its availability, then the Receipt. The old Version stays current
    # until the new one can serve (part1 "States and transitions"): its availability moves later.
    r2 = ingest(api, a, "doc", "second text")
    more, cursor = poll_until(api, a, cursor, resolved_all([r2]))
    v2 = wait_resolved(api, r2)["version_id"]
    mine = until_resolved(for_receipt(more, r2))
    assert mine[0]["kind"] == "record.accepted" and mine[0]["version_id"] == v2
    assert mine[-1]["kind"] == "receipt.resolved" and mine[-1]["version_id"] == v2
    assert [(e["kind"], e["version_id"]) for e in mine[1:-1]] == [("record.availability_changed", v2)]
    events += more

    # A duplicate changes nothing but resolves its Receipt (linked to the existing Version).
    r3 = ingest(api, a, "doc", "second text")
    more, cursor = poll_until(api, a, cursor, resolved_all([r3]))
    assert [(e["kind"], e["version_id"]) for e in for_receipt(more, r3)] == [("receipt.resolved", v2)]
    events += more

    # A withdrawal: record.withdrawn, then the Receipt (no Version linked).
    w = api.post("/v0/records/withdrawals", json={"idempotency_key": uuid.uuid4().hex, "source": {
        "corpus_id": a, "namespace": "test", "record_key": "doc"}}).json()["receipt_id"]
    more, cursor = poll_until(api, a, cursor, resolved_all([w]))
    mine = for_receipt(more, w)
    assert [e["kind"] for e in mine] == ["record.withdrawn", "receipt.resolved"]
    assert mine[0]["subject"] == {"type": "record", "id": rec}
    assert mine[1]["subject"] == {"type": "receipt", "id": w} and "version_id" not in mine[1]
    events += more

    for e in events:
        assert_change_event(e, a)
    # decisions.md Change feed: events of another Corpus never appear.
    foreign = {other["receipt_id"], other["record_id"], other["version_id"]}
    assert not foreign & {v for e in events for v in (e.get("receipt_id"), e.get("version_id"), e["subject"]["id"])}
    # Commit order: committed_at never goes back; event ids unique.
    stamps = [datetime.fromisoformat(e["committed_at"].replace("Z", "+00:00")) for e in events]
    assert stamps == sorted(stamps)
    assert len({e["event_id"] for e in events}) == len(events)
    # decisions.md Change feed: ids only, never content.
    assert "first text" not in json.dumps(events) and "second text" not in json.dumps(events)

    # Reading again from the start gives the same events in the same order, also page by page (up to
    # the withdrawal's resolution: the first reading's last page may hold later availability moves).
    again, _ = poll_until(api, a, cursor0, resolved_all([w]), limit=1)
    assert [e["event_id"] for e in up_to_last_resolution(again, [w])] == \
        [e["event_id"] for e in up_to_last_resolution(events, [w])]
    page = poll(api, a, cursor0, limit=2)
    assert [e["event_id"] for e in page["items"]] == [e["event_id"] for e in events[:2]]
    # decisions.md Change feed: limit 1..1000, malformed -> 422 invalid_input /limit.
    for bad in ("0", "1001", "x"):
        body = assert_error(api.get("/v0/changes", params={"corpus_id": a, "cursor": cursor0, "limit": bad}),
                            422, "invalid_input")
        assert body["field"] == "/limit"
    assert poll(api, a, cursor0, limit=1000)["items"][0]["event_id"] == events[0]["event_id"]


def test_next_cursor_advances_over_invisible_events(api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    c0 = start_now(api, a)
    rb = ingest(api, b, "x", "invisible to a")
    wait_resolved(api, rb)
    page = poll(api, a, c0)
    # part1 rule 18: next_cursor advances over scanned events even when none is visible.
    assert page["items"] == []
    c1 = page["next_cursor"]
    assert c1 != c0
    assert cursor_position(c1) > cursor_position(c0)  # white-box: the journal position moved past B's events
    # The advanced cursor still delivers A's later events, and only those.
    ra = ingest(api, a, "y", "visible")
    events, _ = poll_until(api, a, c1, resolved_all([ra]))
    assert {e["receipt_id"] for e in events} == {ra}
    # A poll with nothing new keeps the position.
    c2 = poll(api, a, c1)["next_cursor"]
    assert cursor_position(c2) >= cursor_position(c1)


def test_poll_cursor_scope_and_validity(server, make_key, org, api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    cursor_a = start_now(api, a)
    # part1 rule 18: a changed filter -> 409 cursor_scope_changed with resync_url /v0/records?corpus_id=...
    body = assert_error(api.get("/v0/changes", params={"corpus_id": b, "cursor": cursor_a}),
                        409, "cursor_scope_changed")
    assert body["resync_url"] == f"/v0/records?corpus_id={b}"
    # decisions.md Change feed: the cursor binds a digest of the key's scope.
    with client_for(server, make_key(org, "*", f"{a},{b}")) as narrower:
        body = assert_error(narrower.get("/v0/changes", params={"corpus_id": a, "cursor": cursor_a}),
                            409, "cursor_scope_changed")
        assert body["resync_url"] == f"/v0/records?corpus_id={a}"
    with client_for(server, make_key(org, "changes:read")) as fewer_actions:
        assert_error(fewer_actions.get("/v0/changes", params={"corpus_id": a, "cursor": cursor_a}),
                     409, "cursor_scope_changed")
    # decisions.md Change feed: another key with the same scope may use the cursor.
    with client_for(server, make_key(org)) as same_scope:
        assert same_scope.get("/v0/changes", params={"corpus_id": a, "cursor": cursor_a}).status_code == 200
    # Another Organization's key never learns about the Corpus.
    with client_for(server, make_key(f"org-{uuid.uuid4().hex[:8]}")) as stranger:
        assert_error(stranger.get("/v0/changes", params={"corpus_id": a, "cursor": cursor_a}), 404, "not_found")

    # Opaque and tamper-evident: garbage, a forged payload, a record page cursor -> 422 invalid_cursor.
    raw = base64.urlsafe_b64decode(cursor_a + "=" * (-len(cursor_a) % 4))
    payload = json.loads(raw[:-16])
    payload["pos"] = 0
    forged = base64.urlsafe_b64encode(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
                                      + raw[-16:]).rstrip(b"=").decode()
    for bad in ("garbage", forged, cursor_a[:-2], "~~~"):
        body = assert_error(api.get("/v0/changes", params={"corpus_id": a, "cursor": bad}), 422, "invalid_cursor")
        assert body["field"] == "/cursor"
    corpus_page_cursor = api.get("/v0/corpora", params={"limit": 1}).json()["next_page_cursor"]
    assert_error(api.get("/v0/changes", params={"corpus_id": a, "cursor": corpus_page_cursor}),
                 422, "invalid_cursor")
    # decisions.md Change feed: corpus_id is required; part 1 scope rules for the named Corpus.
    assert assert_error(api.get("/v0/changes"), 422, "invalid_input")["field"] == "/corpus_id"
    assert_error(api.get("/v0/changes", params={"corpus_id": "no-such-corpus"}), 404, "not_found")
    with client_for(server, make_key(org, "*", b)) as only_b:
        assert_error(only_b.get("/v0/changes", params={"corpus_id": a}), 403, "forbidden")


def test_expired_cursor_and_idle_checkpoints(database_url, tmp_path, api):
    a = create_corpus(api, _cid("a"))
    old = start_now(api, a)
    old_at = time.monotonic()
    second = ServerProcess(database_url, tmp_path, extra_env={"CONTENTSVC_CHANGE_RETENTION": "1",
                                                              "CONTENTSVC_STREAM_CHECKPOINT_SECONDS": "1"})
    try:
        with client_for(second, api.headers["authorization"].partition(" ")[2]) as short:
            time.sleep(max(0.0, 2.1 - (time.monotonic() - old_at)))  # the cursor older than 1 s by a margin
            # decisions.md Change feed: older than the retention -> 410 cursor_expired, never a silent reset.
            body = assert_error(short.get("/v0/changes", params={"corpus_id": a, "cursor": old}), 410,
                                "cursor_expired")
            assert body["resync_url"] == f"/v0/records?corpus_id={a}"  # part1 rule 18
            # part1 rule 19: an expired resume cursor is HTTP 410 before headers.
            body = stream_error(short, a, 410, "cursor_expired", last_event_id=old)
            assert body["resync_url"] == f"/v0/records?corpus_id={a}"
            stream_error(short, a, 410, "cursor_expired", cursor=old)
            # The same cursor is still good under the default retention.
            assert poll(api, a, old)["items"] == []

            # decisions.md Change feed: a checkpoint at least every N seconds while idle (N=1 here).
            with open_stream(short, a) as r:
                assert r.status_code == 200
                frames = sse_frames(r)
                checkpoints = []
                started = time.time()
                for frame in frames:
                    assert frame["event"] == "checkpoint", frame
                    assert json.loads(frame["data"]) == {"cursor": frame["id"]}
                    checkpoints.append(frame["id"])
                    if len(checkpoints) == 3:
                        break
                assert time.time() - started < 8
            # Cursors are shared by every process of the deployment.
            assert poll(api, a, checkpoints[-1])["items"] == []
    finally:
        second.stop()


# ----------------------------------------------------------------- stream


def test_stream_start_now_disconnect_and_resume(api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    cursor_b = start_now(api, b)
    seen: dict[str, dict] = {}
    first_batch = []
    with open_stream(api, a) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(r)
        # part1 rule 19: the initial start-now checkpoint, data {"cursor": X} and id X.
        first = next(frames)
        assert first["event"] == "checkpoint"
        assert json.loads(first["data"]) == {"cursor": first["id"]}
        start_cursor = first["id"]
        first_batch = [ingest(api, a, f"k{i}", f"text {i}") for i in range(3)]
        ingest(api, b, "noise", "other corpus")
        # Read mid-way: stop after the first Receipt resolves, more events are still in flight.
        last_id = read_changes_until(frames, a, lambda ev: any(e["kind"] == "receipt.resolved" for e in ev), seen)
    seen_before = set(seen)
    # Disconnected: more changes happen.
    second_batch = [ingest(api, a, f"k{i}", f"text {i}") for i in range(3, 6)]
    receipts = first_batch + second_batch

    # part1 rule 19: Last-Event-ID takes precedence over a (stale) query cursor on reconnect.
    with open_stream(api, a, cursor=start_cursor, last_event_id=last_id) as r:
        assert r.status_code == 200
        frames = sse_frames(r)
        resumed_first = None
        for frame in frames:
            if frame["event"] == "change":
                resumed_first = json.loads(frame["data"])
                seen.setdefault(resumed_first["event_id"], resumed_first)
                break
        # Resumed after Last-Event-ID, not from the stale cursor (which stands before everything seen).
        assert resumed_first["event_id"] not in seen_before
        read_changes_until(frames, a, resolved_all(receipts), seen)

    # Every event was received, none lost: compare with the poll feed from the same start (dedupe by event_id).
    polled, end_cursor = poll_until(api, a, start_cursor, resolved_all(receipts))
    # Both reads stop once every Receipt resolved; compare them up to that point of the
    # commit order (search availability events keep arriving after it).
    polled = up_to_last_resolution(polled, receipts)
    streamed = up_to_last_resolution(list(seen.values()), receipts)
    assert {e["event_id"] for e in polled} == {e["event_id"] for e in streamed}
    for receipt_id in receipts:
        assert [e["kind"] for e in until_resolved(for_receipt(polled, receipt_id))] == \
            ["record.accepted", "record.availability_changed", "receipt.resolved"]
        assert [e["kind"] for e in until_resolved(for_receipt(streamed, receipt_id))] == \
            ["record.accepted", "record.availability_changed", "receipt.resolved"]

    # part1 rule 19: Last-Event-ID wins even over an invalid or foreign query cursor.
    for stale in ("garbage", cursor_b):
        with open_stream(api, a, cursor=stale, last_event_id=end_cursor) as r:
            assert r.status_code == 200
            frame = next(sse_frames(r))
            assert frame["event"] in ("change", "checkpoint") and frame["id"]
    # The query cursor alone resumes too (a poll cursor is a stream cursor).
    with open_stream(api, a, cursor=start_cursor) as r:
        frame = next(sse_frames(r))
        assert frame["event"] == "change"
        assert json.loads(frame["data"])["event_id"] == polled[0]["event_id"]


def test_stream_resume_errors_before_headers(server, make_key, org, api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    cursor_b = start_now(api, b)
    cursor_a = start_now(api, a)
    # part1 rule 19: a resume cursor whose scope changed is HTTP 409 before headers.
    body = stream_error(api, a, 409, "cursor_scope_changed", last_event_id=cursor_b)
    assert body["resync_url"] == f"/v0/records?corpus_id={a}"
    stream_error(api, a, 409, "cursor_scope_changed", cursor=cursor_b)
    with client_for(server, make_key(org, "changes:read", a)) as narrower:
        stream_error(narrower, a, 409, "cursor_scope_changed", last_event_id=cursor_a)
    # Not a cursor at all: 422 invalid_cursor, naming where it came from.
    body = stream_error(api, a, 422, "invalid_cursor", last_event_id="garbage")
    assert body["field"] == "/last-event-id"
    body = stream_error(api, a, 422, "invalid_cursor", cursor="garbage")
    assert body["field"] == "/cursor"
    assert assert_error(api.get("/v0/changes/stream"), 422, "invalid_input")["field"] == "/corpus_id"


def test_stream_checkpoint_when_only_invisible_events(api):
    a = create_corpus(api, _cid("a"))
    b = create_corpus(api, _cid("b"))
    with open_stream(api, a) as r:
        frames = sse_frames(r)
        first = next(frames)
        assert first["event"] == "checkpoint"
        wait_resolved(api, ingest(api, b, "x", "elsewhere"))
        # part1 rule 19: checkpoint events carry a cursor when no visible event is emitted.
        frame = next(frames)
        assert frame["event"] == "checkpoint", frame
        assert frame["id"] != first["id"]
        assert cursor_position(frame["id"]) > cursor_position(first["id"])
    # That checkpoint is a valid resume point: nothing of B follows it.
    assert poll(api, a, frame["id"])["items"] == []


def test_stream_revoked_key_gets_stream_error(server, database_url, org, api):
    a = create_corpus(api, _cid("a"))
    with psycopg.connect(database_url, autocommit=True) as conn:
        created = keys.create_key(conn, org, keys.parse_actions("*"), None, "stream")
    with client_for(server, created.secret) as client, open_stream(client, a) as r:
        frames = sse_frames(r)
        first = next(frames)
        assert first["event"] == "checkpoint"
        with psycopg.connect(database_url, autocommit=True) as conn:
            keys.revoke_key(conn, created.key_id)
        ingest(api, a, "wake", "wake the stream")
        # part1 rule 19 + Events: after headers an error is a stream_error event (Error JSON), then close,
        # without advancing id.
        rest = list(frames)
        assert rest, "no frame after revocation"
        last = rest[-1]
        assert last["event"] == "stream_error"
        assert "id" not in last
        error = json.loads(last["data"])
        assert error["code"] == "invalid_api_key"
        assert set(error) <= {"code", "message", "retryable", "field", "resync_url"}
        assert all(f["event"] in ("change", "checkpoint") for f in rest[:-1])
