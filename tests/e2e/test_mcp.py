"""The agent tool server, driven by the MCP SDK's own client over stdio (part1 "Agent tool server").

Each test launches `contentsvc mcp --profile ...` as an agent host would,
with CONTENTSVC_URL and CONTENTSVC_API_KEY, against the real server process.
"""

import asyncio
import os
import sys
import time
from contextlib import asynccontextmanager

import psycopg
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from contentsvc.processes.local_service import free_port
from tests.conftest import create_corpus, text_command, wait_resolved

READ_TOOLS = ["list_corpora", "search", "read_record"]


@asynccontextmanager
async def tool_session(base_url: str, key: str, profile: str = "read"):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "contentsvc.cli", "mcp", "--profile", profile],
        env={**os.environ, "CONTENTSVC_URL": base_url, "CONTENTSVC_API_KEY": key})
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session, name: str, arguments: dict) -> tuple[bool, dict]:
    result = await session.call_tool(name, arguments)
    assert result.content and result.content[0].type == "text"  # structured and as text
    return result.is_error, result.structured_content


def run(coro):
    return asyncio.run(coro)


def test_tool_listing_per_profile(server, make_key, org):
    key = make_key(org)

    async def scenario():
        async with tool_session(server.base_url, key, "read") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert sorted(tools) == sorted(READ_TOOLS)  # part1: read lists only these
            assert all(t.annotations.read_only_hint for t in tools.values())
            assert tools["list_corpora"].annotations.idempotent_hint
            search = tools["search"].input_schema
            assert search["required"] == ["query", "corpus_ids"] and search["additionalProperties"] is False
            assert search["properties"]["query"]["maxLength"] == 8192
            assert search["properties"]["corpus_ids"]["maxItems"] == 16
            assert search["properties"]["corpus_ids"]["uniqueItems"] is True
            assert search["properties"]["limit"] == {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}
            assert search["properties"]["profile"]["pattern"] == "^[a-z][a-z0-9_]{0,31}$"
            assert search["properties"]["filter"]["additionalProperties"] is False
            namespaces = search["properties"]["filter"]["properties"]["source_namespaces"]
            assert (namespaces["minItems"], namespaces["maxItems"], namespaces["items"]["maxLength"]) == (1, 50, 200)
        async with tool_session(server.base_url, key, "ingest") as s:
            tools = {t.name: t for t in (await s.list_tools()).tools}
            assert sorted(tools) == sorted(READ_TOOLS + ["ingest_text", "read_receipt"])
            ingest = tools["ingest_text"]
            assert ingest.annotations.read_only_hint is False and ingest.annotations.idempotent_hint is True
            assert ingest.input_schema["properties"]["namespace"]["default"] == "mcp"
            assert not any(word in name for name in tools for word in ("withdraw", "delete"))

    run(scenario())


async def wait_searchable(s, receipt_id: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        error, receipt = await call(s, "read_receipt", {"receipt_id": receipt_id})
        assert not error, receipt
        if (receipt.get("availability") or {}).get("searchable"):
            return receipt
        await asyncio.sleep(0.1)
    raise AssertionError("not searchable in time")


def test_ingest_follow_search_and_cite(server, make_key, org, api):
    corpus = create_corpus(api)
    key = make_key(org)

    async def scenario():
        async with tool_session(server.base_url, key, "ingest") as s:
            text = "Zebrafish regenerate heart tissue after injury. Ünïcode ok."
            error, receipt = await call(s, "ingest_text", {"corpus_id": corpus, "record_key": "fish", "text": text})
            assert not error and receipt["source"]["namespace"] == "mcp"  # default namespace
            ready = await wait_searchable(s, receipt["receipt_id"])
            assert ready["outcome"] == "created"
            error, result = await call(s, "search", {"query": "zebrafish heart", "corpus_ids": [corpus],
                                                     "mode": "lexical"})
            assert not error and result["retrieval_profile"]["name"] == "default"
            hit = result["items"][0]
            assert (hit["record_id"], hit["version_id"]) == (ready["record_id"], ready["version_id"])
            error, read = await call(s, "read_record", {"record_id": hit["record_id"]})
            assert not error and read["record"]["current_version_id"] == hit["version_id"]
            part = next(p for p in read["version"]["manifest"]["parts"] if p["key"] == hit["part_key"])
            cited = part["content"]["text"][hit["excerpt"]["start"]:hit["excerpt"]["end"]]
            assert cited == hit["excerpt"]["text"]  # citation by offsets in code points
            # Repeating the same arguments returns the same Receipt.
            error, again = await call(s, "ingest_text", {"corpus_id": corpus, "record_key": "fish", "text": text})
            assert again["receipt_id"] == receipt["receipt_id"]

    run(scenario())


def test_replaced_text_is_ingested_again(server, make_key, org, api):
    # part1 ingest rules: when the Receipt's Version was since replaced, a repeated call ingests again.
    corpus = create_corpus(api)
    key = make_key(org)

    async def scenario():
        async with tool_session(server.base_url, key, "ingest") as s:
            first_args = {"corpus_id": corpus, "record_key": "doc", "text": "first text"}
            _, first = await call(s, "ingest_text", first_args)
            first = await wait_searchable(s, first["receipt_id"])
            _, second = await call(s, "ingest_text", {**first_args, "text": "second text"})
            second = await wait_searchable(s, second["receipt_id"])
            assert second["version_id"] != first["version_id"]
            _, again = await call(s, "ingest_text", first_args)
            assert again["receipt_id"] != first["receipt_id"]
            again = await wait_searchable(s, again["receipt_id"])
            _, read = await call(s, "read_record", {"record_id": first["record_id"]})
            current = read["version"]
            assert current["manifest"]["parts"][0]["content"]["text"] == "first text"
            assert read["record"]["current_version_id"] == again["version_id"]
            # Older Versions stay readable.
            _, old = await call(s, "read_record", {"record_id": first["record_id"], "version_id": first["version_id"]})
            assert old["version"]["version_id"] == first["version_id"]

    run(scenario())


def test_errors_reach_the_agent_with_the_contract_code(server, make_key, org, api):
    corpus = create_corpus(api)
    other = create_corpus(api)

    async def scenario():
        async with tool_session(server.base_url, make_key(org), "ingest") as s:
            args = {"corpus_id": corpus, "record_key": "k", "text": "one", "idempotency_key": "mine"}
            error, _ = await call(s, "ingest_text", args)
            assert not error
            error, body = await call(s, "ingest_text", {**args, "text": "two"})
            assert error and body["code"] == "idempotency_conflict"
        scoped = make_key(org, "*", corpus)
        async with tool_session(server.base_url, scoped, "read") as s:
            error, body = await call(s, "search", {"query": "x", "corpus_ids": [corpus, other]})
            assert error and body["code"] == "forbidden"  # never silently skipped
        no_search = make_key(org, "content:read,corpora:read", "*")
        async with tool_session(server.base_url, no_search, "read") as s:
            error, body = await call(s, "search", {"query": "x", "corpus_ids": [corpus]})
            assert error and body["code"] == "forbidden"

    run(scenario())


def test_an_id_is_one_path_segment_and_reaches_no_other_route(server, make_key, org, api):
    # part1 Security: every access authorized; a tool reaches only its own route. An id holding
    # `/` or `..` was joined into the path as it was, and the client resolved the dot segments:
    # read_record with version_id `../../../corpora` answered the Corpus listing as the "version".
    corpus = create_corpus(api)
    r = api.post("/v0/records", json=text_command(corpus, "k", "a record to read"))
    record_id = wait_resolved(api, r.json()["receipt_id"])["record_id"]

    async def scenario():
        async with tool_session(server.base_url, make_key(org), "read") as s:
            for args in ({"record_id": record_id, "version_id": "../../../corpora"},
                         {"record_id": f"../../ingestion-receipts/{r.json()['receipt_id']}"},
                         {"record_id": ".."}, {"record_id": "a/b?c=d"}):
                error, body = await call(s, "read_record", args)
                assert error and body["code"] == "not_found", (args, body)

    run(scenario())


def test_bad_arguments_are_refused_before_any_http_call(make_key, org):
    # The server URL answers nothing: an argument error must come first, not "unreachable".
    dead = f"http://127.0.0.1:{free_port()}"

    async def scenario():
        async with tool_session(dead, "csk_unused", "read") as s:
            for bad in ({"query": "", "corpus_ids": ["c"]},
                        {"query": "q", "corpus_ids": [f"c{i}" for i in range(17)]},
                        {"query": "q", "corpus_ids": ["c"], "limit": 51},
                        {"query": "q", "corpus_ids": ["c"], "filter": {"source_namespaces": ["a"], "other": 1}},
                        {"query": "q", "corpus_ids": ["c", "c"]},
                        {"query": "q" * 8193, "corpus_ids": ["c"]}):
                error, body = await call(s, "search", bad)
                assert error and body["code"] == "invalid_arguments", (bad, body)
            # A well-formed call to a server that is down is an error, not an empty list.
            error, body = await call(s, "list_corpora", {})
            assert error and body["code"] == "server_unreachable"
            error, body = await call(s, "search", {"query": "q", "corpus_ids": ["c"]})
            assert error and body["code"] == "server_unreachable"

    run(scenario())


ERROR_MEMBERS = {"code", "message", "retryable", "field", "resync_url"}


def test_tool_errors_are_the_contract_error_object(server, make_key, org, api, database_url):
    # part1 Agent tool server + Error: a tool error is the Error object (code, message, retryable,
    # field, resync_url; nothing else), so an agent keeps the retry hint of a 503 or 504.
    corpus = create_corpus(api)
    r = api.post("/v0/records", json={"idempotency_key": "mcp-errors", "content": {"kind": "text",
              "text": "Deadline probe about otters."}, "source": {"corpus_id": corpus, "namespace": "n",
                                                                  "record_key": "otter"}})
    assert r.status_code == 202, r.text
    deadline = time.time() + 60
    while not (api.get(f"/v0/ingestion-receipts/{r.json()['receipt_id']}").json().get("availability")
               or {}).get("searchable"):
        assert time.time() < deadline, "not searchable"
        time.sleep(0.1)

    async def scenario():
        async with tool_session(server.base_url, make_key(org), "read") as s:
            # part1 rule 20: a search past the profile's budget is 504 search_deadline_exceeded, retryable.
            # Holding a lock on the read table the hydration reads stalls it, as a slow database would.
            with psycopg.connect(database_url) as stall:
                stall.execute("SET lock_timeout = '5s'")
                stall.execute("LOCK TABLE versions IN ACCESS EXCLUSIVE MODE")
                error, body = await call(s, "search", {"query": "otters", "corpus_ids": [corpus], "mode": "lexical"})
                stall.rollback()
            assert error and body["code"] == "search_deadline_exceeded", body
            assert body["retryable"] is True and set(body) <= ERROR_MEMBERS and body["message"]
            # A refusal is not retryable; a bad argument names its field as a JSON Pointer.
            error, body = await call(s, "read_record", {"record_id": "rec_nope"})
            assert error and body == {"code": "not_found", "message": body["message"], "retryable": False}
            error, body = await call(s, "search", {"query": "q", "corpus_ids": [corpus], "limit": 51})
            assert error and body["code"] == "invalid_arguments" and body["retryable"] is False
            assert body["field"] == "/limit" and set(body) <= ERROR_MEMBERS
        # An unreachable service may answer later: retryable.
        async with tool_session(f"http://127.0.0.1:{free_port()}", "csk_unused", "read") as s:
            error, body = await call(s, "list_corpora", {})
            assert error and body["code"] == "server_unreachable" and body["retryable"] is True
            assert set(body) <= ERROR_MEMBERS

    run(scenario())
