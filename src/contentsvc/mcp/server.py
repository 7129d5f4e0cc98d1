"""The MCP server: tools over stdin/stdout, each call an HTTP request to the service.

The API key decides on the server what every call may reach; the profile
only narrows which tools are listed. Nothing but protocol frames goes to
stdout: logs go to stderr.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from typing import Any
from urllib.parse import quote

import anyio
import httpx
import msgspec
from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

from contentsvc import __version__
from contentsvc.config.settings import ClientSettings
from contentsvc.mcp.tools import TOOLS, InvalidArguments, input_schema, parse, tools_for


RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})  # for an answer without the Error envelope


class ToolError(Exception):
    """A failed tool call, as the contract's Error object: an agent branches on `code` and keeps
    the retry hint (`retryable`) and, when the service gave them, `field` and `resync_url`."""

    def __init__(self, code: str, message: str, *, retryable: bool = False, field: str | None = None,
                 resync_url: str | None = None) -> None:
        super().__init__(message)
        self.error: dict[str, Any] = {"code": code, "message": message, "retryable": retryable}
        if field is not None:
            self.error["field"] = field
        if resync_url is not None:
            self.error["resync_url"] = resync_url

    @classmethod
    def from_answer(cls, status: int, body: Any) -> "ToolError":
        """The service's Error envelope as it is; any other error answer (a proxy's page, say)
        becomes one, retryable when its status says the same request may succeed later."""
        if isinstance(body, dict) and isinstance(body.get("code"), str) and isinstance(body.get("message"), str) \
                and isinstance(body.get("retryable"), bool):
            optional = {k: body[k] for k in ("field", "resync_url") if isinstance(body.get(k), str)}
            return cls(body["code"], body["message"], retryable=body["retryable"], **optional)
        return cls(f"http_{status}", f"The service answered {status}.", retryable=status in RETRYABLE_STATUSES)


class Service:
    """The HTTP side: one client with the key, errors turned into ToolError."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=30,
                                        headers={"Authorization": f"Bearer {api_key}"})

    async def call(self, method: str, path: str, **kwargs) -> dict:
        try:
            r = await self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ToolError("server_unreachable", f"The content service at {self.client.base_url} could not be "
                                                  f"reached ({type(exc).__name__}).", retryable=True) from None
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code >= 400:
            raise ToolError.from_answer(r.status_code, body)
        return body


def _segment(resource_id: str) -> str:
    """An id as one path segment: an agent's `../corpora` or `a/b` must name no other route."""
    return quote(resource_id, safe="").replace(".", "%2E")  # `..` too, which a client would resolve


def default_key(corpus_id: str, namespace: str, record_key: str, text: str) -> str:
    digest = hashlib.sha256()
    for part in (corpus_id, namespace, record_key, text):
        digest.update(part.encode() + b"\x00")
    return "mcp-" + digest.hexdigest()


RECEIPT_FIELDS = ("receipt_id", "state", "outcome", "record_id", "version_id", "availability", "processing",
                  "diagnostics", "source")


def receipt_shape(receipt: dict) -> dict:
    return {k: receipt[k] for k in RECEIPT_FIELDS if k in receipt}


async def list_corpora(service: Service, args) -> dict:
    params = {"page_cursor": args.page_cursor} if args.page_cursor else {}
    page = await service.call("GET", "/v0/corpora", params=params)
    out = {"items": [{"corpus_id": c["corpus_id"], "name": c["name"], "effective_retrieval": c["retrieval"]}
                     for c in page["items"]]}
    if page.get("next_page_cursor"):
        out["next_page_cursor"] = page["next_page_cursor"]
    return out


async def search(service: Service, args) -> dict:
    body = {k: v for k, v in msgspec.to_builtins(args).items() if v is not None}
    return await service.call("POST", "/v0/search", json=body)


async def read_record(service: Service, args) -> dict:
    record = await service.call("GET", f"/v0/records/{_segment(args.record_id)}")
    version_id = args.version_id or record.get("current_version_id")
    if version_id is None:
        raise ToolError("not_found", "The Record has no Version to read.")
    version = await service.call("GET", f"/v0/records/{_segment(args.record_id)}/versions/{_segment(version_id)}")
    return {"record": record, "version": version}


async def ingest_text(service: Service, args) -> dict:
    def command(key: str) -> dict:
        return {"idempotency_key": key,
                "source": {"corpus_id": args.corpus_id, "namespace": args.namespace, "record_key": args.record_key},
                "content": {"kind": "text", "text": args.text}}

    if args.idempotency_key:  # the caller's key: replays, or conflicts with other arguments
        return receipt_shape(await service.call("POST", "/v0/records", json=command(args.idempotency_key)))
    key = default_key(args.corpus_id, args.namespace, args.record_key, args.text)
    receipt = await service.call("POST", "/v0/records", json=command(key))
    version_id = receipt.get("version_id")
    if receipt.get("state") == "resolved" and version_id:
        record = await service.call("GET", f"/v0/records/{_segment(receipt['record_id'])}")
        current = record.get("current_version_id")
        # No current Version yet (the first one is still building): nothing replaced this text.
        if current is not None and current != version_id and not record.get("withdrawn"):
            # Replaced by another text since: ingest again so this text becomes current once more.
            # The key names the Version it replaces, so repeating this call replays this ingest.
            receipt = await service.call("POST", "/v0/records", json=command(f"{key}-after-{current}"))
    return receipt_shape(receipt)


async def read_receipt(service: Service, args) -> dict:
    return receipt_shape(await service.call("GET", f"/v0/ingestion-receipts/{_segment(args.receipt_id)}"))


HANDLERS = {"list_corpora": list_corpora, "search": search, "read_record": read_record,
            "ingest_text": ingest_text, "read_receipt": read_receipt}


def _result(structured: dict, is_error: bool = False) -> types.CallToolResult:
    text = msgspec.json.encode(structured).decode()
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                structured_content=structured, is_error=is_error)


def build_server(profile: str, service: Service) -> Server:
    names = tools_for(profile)

    async def on_list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(
                name=name, description=TOOLS[name]["description"], input_schema=input_schema(name),
                annotations=types.ToolAnnotations(
                    read_only_hint=TOOLS[name]["read_only"], idempotent_hint=TOOLS[name]["idempotent"],
                    destructive_hint=False, open_world_hint=False),
            )
            for name in names
        ])

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            if params.name not in names:
                raise ToolError("unknown_tool", f"No tool {params.name!r} in the {profile!r} profile.")
            try:
                args = parse(params.name, params.arguments)
            except InvalidArguments as exc:
                raise ToolError("invalid_arguments", exc.message, field=exc.field) from None
            return _result(await HANDLERS[params.name](service, args))
        except ToolError as exc:
            return _result(exc.error, True)

    return Server("contentsvc", version=__version__, on_list_tools=on_list_tools, on_call_tool=on_call_tool)


DEFAULT_SERVICE_URL = "http://127.0.0.1:8080"


async def serve(profile: str, client: ClientSettings) -> None:
    service = Service(client.url or DEFAULT_SERVICE_URL, client.api_key or "")
    server = build_server(profile, service)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main(profile: str, client: ClientSettings) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per call is noise to an agent host
    if not client.api_key:
        print("CONTENTSVC_API_KEY is not set (nor [client] api_key): the agent tool server needs an API key.",
              file=sys.stderr)
        return 2
    anyio.run(serve, profile, client)
    return 0
