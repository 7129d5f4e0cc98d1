"""The OpenAPI 3.1 document, generated from the msgspec Structs.

Litestar's own generator is off: request bodies are decoded by hand (to
give the contract's error codes and pointers), so this table states each
operation's body and answers, and msgspec renders the schemas.
"""

from __future__ import annotations

from functools import lru_cache

import msgspec
from litestar import Response, get

from contentsvc import __version__
from contentsvc.domain import models as m

# operation id -> (method, path, permission, request Struct, {status: response Struct}, query params)
OPERATIONS: list[tuple[str, str, str, str | None, type | None, dict[int, type], list[tuple[str, str, bool]]]] = [
    ("ingestRecord", "post", "/v0/records", "content:write", m.IngestCommand, {202: m.Receipt}, []),
    ("listRecords", "get", "/v0/records", "content:read", None, {200: m.RecordPage},
     [("corpus_id", "string", True), ("page_cursor", "string", False), ("limit", "integer", False)]),
    ("ingestBatch", "post", "/v0/records/batch", "content:write", m.BatchRequest, {200: m.BatchResult}, []),
    ("withdrawRecord", "post", "/v0/records/withdrawals", "content:write", m.WithdrawalCommand, {202: m.Receipt}, []),
    ("getRecord", "get", "/v0/records/{record_id}", "content:read", None, {200: m.Record}, []),
    ("getVersion", "get", "/v0/records/{record_id}/versions/{version_id}", "content:read", None, {200: m.Version}, []),
    ("getReceipt", "get", "/v0/ingestion-receipts/{receipt_id}", "content:read", None, {200: m.Receipt}, []),
    ("createCorpus", "post", "/v0/corpora", "corpora:write", m.CorpusRequest, {201: m.Corpus, 200: m.Corpus}, []),
    ("listCorpora", "get", "/v0/corpora", "corpora:read", None, {200: m.CorpusPage},
     [("page_cursor", "string", False), ("limit", "integer", False)]),
    ("getCorpus", "get", "/v0/corpora/{corpus_id}", "corpora:read", None, {200: m.Corpus}, []),
    ("pollChanges", "get", "/v0/changes", "changes:read", None, {200: m.ChangePage},
     [("corpus_id", "string", True), ("cursor", "string", False), ("limit", "integer", False)]),
    ("streamChanges", "get", "/v0/changes/stream", "changes:read", None, {200: None},
     [("corpus_id", "string", True), ("cursor", "string", False)]),
    ("getHealth", "get", "/v0/health", "", None, {200: m.Health}, []),
    ("createUpload", "post", "/v0/uploads", "blobs:write", m.UploadRequest, {201: m.Upload, 200: m.Upload}, []),
    # The presigned PUT: no API key; the body is the raw bytes, with the Upload's put_headers.
    ("putUploadContent", "put", "/v0/uploads/{upload_id}/content", "", None, {200: m.Upload},
     [("expires", "integer", True), ("signature", "string", True)]),
    ("confirmUpload", "post", "/v0/uploads/{upload_id}/confirm", "blobs:write", m.ActionRequest, {202: m.Upload}, []),
    ("getUpload", "get", "/v0/uploads/{upload_id}", "blobs:read", None, {200: m.Upload}, []),
    ("getBlob", "get", "/v0/blobs/{blob_id}", "blobs:read", None, {200: m.Blob}, []),
    ("searchRecords", "post", "/v0/search", "content:read search:query", m.SearchRequest, {200: m.SearchResponse}, []),
    ("listSearchProfiles", "get", "/v0/search/profiles", "search:query", None, {200: m.SearchProfileList}, []),
    ("listVectorSpaces", "get", "/v0/corpora/{corpus_id}/vector-spaces", "corpora:read", None,
     {200: m.VectorSpaceList}, []),
    ("getOperation", "get", "/v0/operations/{operation_id}", "operations:read", None, {200: m.Operation}, []),
    ("cancelOperation", "post", "/v0/operations/{operation_id}/cancel", "operations:write", m.ActionRequest,
     {200: m.Operation}, []),
    ("rerunOperation", "post", "/v0/operations/{operation_id}/rerun", "operations:write", m.KeyedActionRequest,
     {202: m.Operation}, []),
    ("resumeOperation", "post", "/v0/operations/{operation_id}/resume", "operations:write", m.ActionRequest,
     {200: m.Operation}, []),
    ("configureRetrieval", "put", "/v0/corpora/{corpus_id}/retrieval", "corpora:write operations:write",
     m.ConfigUpdate, {202: m.Operation}, []),
    ("rebuildCorpusProjection", "post", "/v0/corpora/{corpus_id}/rebuilds", "projections:rebuild",
     m.KeyedActionRequest, {202: m.Operation}, []),
]


@lru_cache(maxsize=1)
def document() -> bytes:
    structs = {m.Error}
    for op in OPERATIONS:
        structs.update(t for t in [op[4], *op[5].values()] if t is not None)
    ordered = sorted(structs, key=lambda t: t.__name__)
    refs, components = msgspec.json.schema_components(ordered, ref_template="#/components/schemas/{name}")
    by_type = dict(zip(ordered, refs))
    paths: dict[str, dict] = {}
    for op_id, method, path, permission, request, responses, query in OPERATIONS:
        parameters = [
            {"name": name[1:-1], "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in path.split("/") if name.startswith("{")
        ] + [
            {"name": name, "in": "query", "required": required, "schema": {"type": kind}}
            for name, kind, required in query
        ]
        answers: dict[str, dict] = {}
        for status, struct in responses.items():
            if struct is None:
                answers[str(status)] = {"description": "text/event-stream of change, checkpoint and stream_error events",
                                        "content": {"text/event-stream": {"schema": {"type": "string"}}}}
            else:
                answers[str(status)] = {"description": struct.__name__,
                                        "content": {"application/json": {"schema": by_type[struct]}}}
        answers["default"] = {"description": "Error", "content": {"application/json": {"schema": by_type[m.Error]}}}
        operation = {
            "operationId": op_id,
            "parameters": parameters,
            "responses": answers,
            "description": f"Requires the action {permission}." if permission else "No key required.",
        }
        if permission:
            operation["security"] = [{"apiKey": []}]
        if request is not None:
            operation["requestBody"] = {"required": True,
                                        "content": {"application/json": {"schema": by_type[request]}}}
        paths.setdefault(path, {})[method] = operation
    return msgspec.json.encode({
        "openapi": "3.1.0",
        "info": {"title": "contentsvc", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    })


@get("/schema/openapi.json", include_in_schema=False)
async def openapi_json() -> Response:
    return Response(content=document(), media_type="application/json")


ROUTES = [openapi_json]
