"""The OpenAPI 3.1 document, generated from the routes the app serves.

Each route's declaration (api/routes.py) names its body, query and answers
as the same msgspec Structs it decodes and encodes with; msgspec renders the
schemas. Litestar's own generator is off: it would describe Litestar's
decoding, not the contract's.
"""

from __future__ import annotations

from typing import Any, Iterator

import msgspec
from litestar import Litestar, Request, Response, get

from contentsvc import __version__
from contentsvc.api.http import services
from contentsvc.api.routes import Operation, Stream, operation_of
from contentsvc.config import Settings
from contentsvc.domain.extensions import INSTALLED_SCHEMA_VERSIONS
from contentsvc.domain.models import Error, Extension
from contentsvc.domain.retrieval import SOURCE_POINTER_PATTERN

REF = "#/components/schemas/{name}"


def declared_operations(app: Litestar) -> Iterator[Operation]:
    """Every operation the app serves, in the order its routes were registered."""
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            spec = operation_of(handler)
            if spec is not None:
                yield spec


def document(app: Litestar, settings: Settings) -> dict[str, Any]:
    operations = list(declared_operations(app))
    structs = {Error}
    for op in operations:
        structs.update(t for t in [op.body, *op.responses.values()] if isinstance(t, type))
        for member in op.members(settings).values():
            structs.update(v for v in member.values() if isinstance(v, type))
    ordered = sorted(structs, key=lambda t: t.__name__)
    _, components = msgspec.json.schema_components(ordered, ref_template=REF)
    paths: dict[str, dict] = {}
    for op in operations:
        if isinstance(op.body, type):
            _refine(components[op.body.__name__], op.members(settings))
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op)
    _declare_extension_namespaces(components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "contentsvc", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


def _ref(struct: type) -> dict[str, str]:
    return {"$ref": REF.format(name=struct.__name__)}


def _refine(schema: dict, members: dict[str, dict]) -> None:
    """Adds the bounds the route enforces beyond its body Struct (a Struct value: its $ref)."""
    for name, keywords in members.items():
        schema["properties"][name].update(
            {k: _ref(v) if isinstance(v, type) else v for k, v in keywords.items()})


def _declare_extension_namespaces(components: dict[str, dict]) -> None:
    """A command's `extensions` takes only the namespaces this deployment declares, each at an
    installed schema version (part 1, Manifest content): the map's keys and versions are listed,
    so the document refuses what the decoding refuses."""
    declared = {
        "type": "object",
        "properties": {
            namespace: {"allOf": [_ref(Extension)], "properties": {"schema_version": {"enum": list(versions)}}}
            for namespace, versions in INSTALLED_SCHEMA_VERSIONS.items()
        },
        "additionalProperties": False,
    }
    open_map = {"type": "object", "additionalProperties": _ref(Extension)}
    for schema in components.values():
        member = schema.get("properties", {}).get("extensions", {})
        if open_map in member.get("anyOf", ()):
            member["anyOf"] = [declared if s == open_map else s for s in member["anyOf"]]
    # A retrieval field reads from the roots the check takes (else 422 invalid_mapping).
    components["FieldMapping"]["properties"]["source_pointer"]["pattern"] = SOURCE_POINTER_PATTERN


def _operation(op: Operation) -> dict[str, Any]:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "parameters": _parameters(op),
        "responses": {
            **{str(status): _content(answer) for status, answer in op.responses.items()},
            "default": _content(Error),
        },
        "description": f"Requires the action {' and '.join(op.permission)}." if op.permission
        else "No API key.",
    }
    if op.permission:
        out["security"] = [{"apiKey": []}]
    if op.body is not None:
        out["requestBody"] = {"required": op.body_required, **_content(op.body)}
    return out


def _content(answer: type | Stream) -> dict[str, Any]:
    if isinstance(answer, Stream):
        return {"description": answer.description, "content": {answer.media_type: {"schema": {}}}}
    return {"description": answer.__name__, "content": {"application/json": {"schema": _ref(answer)}}}


def _parameters(op: Operation) -> list[dict[str, Any]]:
    params = [
        {"name": part[1:-1], "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for part in op.path.split("/") if part.startswith("{")
    ]
    if op.query is not None:
        schema = msgspec.json.schema(op.query)["$defs"][op.query.__name__]
        required = set(schema.get("required", ()))
        params += [_query_parameter(name, name in required, _not_null(prop))
                   for name, prop in schema["properties"].items()]
    params += [{"name": name, "in": "header", "required": required, "schema": {"type": "string"}}
               for name, required in op.headers]
    return params


def _query_parameter(name: str, required: bool, schema: dict) -> dict[str, Any]:
    parameter = {"name": name, "in": "query", "required": required, "schema": schema}
    if not required and schema.get("type") != "integer":
        parameter["allowEmptyValue"] = True  # an empty value is the parameter left out (routes.parse_query)
    return parameter


def _not_null(schema: dict) -> dict:
    """`str | None = None` in a query Struct means the parameter may be absent, never null."""
    if "anyOf" not in schema:
        return schema
    [kept] = [s for s in schema["anyOf"] if s.get("type") != "null"]
    return {**kept, **{k: v for k, v in schema.items() if k != "anyOf" and v is not None}}


@get("/schema/openapi.json", include_in_schema=False)
async def openapi_json(request: Request) -> Response:
    state = request.app.state
    if state.get("openapi") is None:  # the routes are fixed once the app is built: render once
        state["openapi"] = msgspec.json.encode(document(request.app, services(request).settings))
    return Response(content=state["openapi"], media_type="application/json")


ROUTES = [openapi_json]
