"""The served OpenAPI document states what the routes accept.

Every route the app registers appears with its contract operation id, and
the documented request schemas agree with the decoding: a body or query
built from the document is not refused as invalid, and one that breaks a
documented type or bound is refused with the contract's Error.
"""

from __future__ import annotations

import re

import httpx
import jsonschema
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, find, settings, strategies as st
from litestar import Litestar

from contentsvc.api.app import ROUTES
from contentsvc.auth import keys
from tests.conftest import assert_error, create_corpus, text_command

# Part 1's endpoint table, plus getHealth and putUploadContent (decisions.md).
CONTRACT_OPERATIONS = {
    "ingestRecord", "listRecords", "ingestBatch", "withdrawRecord", "getRecord", "getVersion", "getReceipt",
    "createUpload", "putUploadContent", "confirmUpload", "getUpload", "getBlob",
    "getOperation", "cancelOperation", "rerunOperation", "resumeOperation",
    "createCorpus", "listCorpora", "getCorpus", "configureRetrieval", "listVectorSpaces", "rebuildCorpusProjection",
    "pollChanges", "streamChanges", "searchRecords", "listSearchProfiles", "getHealth",
    # part 2 plugin administration (its operation ids are not shown there: docs/decisions.md)
    "registerPlugin", "listPlugins", "getPlugin", "activatePlugin", "getActivePlan", "listPlans", "getPlan",
    "rollbackPlan", "listActivePlugins",
    # part 2 "Saved queries and subscriptions"
    "createSavedQuery", "getSavedQuery", "getSavedQueryVersion", "createSavedQueryVersion", "deleteSavedQuery",
    "renameSavedQuery", "listSubscriptions", "createSubscription", "getSubscription", "getSubscriptionVersion",
    "createSubscriptionVersion", "deleteSubscription", "disableSubscription", "enableSubscription",
    "renameSubscription", "previewSubscription", "listMatches", "getMatch",
    "getDelivery", "listDeliveryAttempts",
    # part 2 "Evaluator migration (plugins:admin)" (its operation id is not shown there: docs/decisions.md)
    "migrateSubscriptionEvaluators",
    # part 2 "Connector management"; the runs routes of decisions-part2 "Runs" (ids not shown: docs/decisions.md)
    "createConnector", "listConnectors", "getConnector", "disableConnector", "replaceConnectorCredential",
    "changeConnectorSchedule", "requestConnectorRun", "listConnectorKinds", "listConnectorRuns", "getConnectorRun",
    "createInstanceToken", "listInstanceTokens", "revokeInstanceToken",
    # part 2 "Webhook relay", "Declared push route"; a declared route's other methods (decisions-part2
    # "Push route"; their ids: docs/decisions.md)
    "relayConnectorChallenge", "relayConnectorDelivery", "pushConnectorAPI", "pushConnectorAPIPut",
    "pushConnectorAPIPatch", "pushConnectorAPIDelete", "challengeConnectorAPI",
}
PUSH_OPERATIONS = {"pushConnectorAPI", "pushConnectorAPIPut", "pushConnectorAPIPatch", "pushConnectorAPIDelete",
                   "challengeConnectorAPI"}
NOT_DOCUMENTED = {"OPTIONS", "HEAD"}  # answered by Litestar itself


@pytest.fixture
def api(server, database_url, org):
    """An operator key (every action, plugins:admin included), so every documented route decodes its input."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        secret = keys.create_key(conn, org, keys.parse_actions("*", operator=True), keys.parse_corpora("*"),
                                 None).secret
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def doc(server) -> dict:
    r = httpx.get(f"{server.base_url}/schema/openapi.json")
    assert r.status_code == 200
    return r.json()


def _operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [(method.upper(), path, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def _keyed(doc: dict) -> list[tuple[str, str, dict]]:
    """Operations behind the API key: the presigned PUT is authorized by its signature instead."""
    return [(m, p, op) for m, p, op in _operations(doc) if op.get("security")]


def test_every_served_route_is_documented_with_its_operation_id(doc):
    app = Litestar(route_handlers=ROUTES, openapi_config=None)
    served = set()
    for route in app.routes:
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)
        for handler in route.route_handlers:
            if not handler.include_in_schema:
                continue
            for method in handler.http_methods - NOT_DOCUMENTED:
                assert doc["paths"][path][method.lower()]["operationId"] == handler.operation_id, (method, path)
                served.add((method, path))
    documented = [(m, p) for m, p, _ in _operations(doc)]
    assert sorted(documented) == sorted(served)  # and nothing documented that is not served
    ids = [op["operationId"] for _, _, op in _operations(doc)]
    assert sorted(ids) == sorted(CONTRACT_OPERATIONS)  # each contract operation exactly once


def test_every_operation_states_its_key_and_errors(doc):
    for method, path, op in _operations(doc):
        assert op["responses"]["default"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"}
        # No API key: health, the presigned PUT, and the push routes (each declared route states its own
        # auth: a service key, an instance token or the source's signature) and the relay.
        keyless = {"getHealth", "putUploadContent", "relayConnectorChallenge", "relayConnectorDelivery",
                   *PUSH_OPERATIONS}
        assert ("security" in op) == (op["operationId"] not in keyless), op["operationId"]
    stream = doc["paths"]["/v0/changes/stream"]["get"]["responses"]["200"]["content"]
    assert list(stream) == ["text/event-stream"]
    optional = {op["operationId"] for _, _, op in _operations(doc)
                if op.get("requestBody", {}).get("required") is False}
    # ActionRequest bodies may be empty (part 1; part 2 delete/disable/enable take ActionRequest)
    assert optional == {"cancelOperation", "resumeOperation", "confirmUpload", "deleteSavedQuery",
                        "deleteSubscription", "disableSubscription", "enableSubscription", "disableConnector",
                        "revokeInstanceToken"}


def _resolve(schema: dict, doc: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _matching(pattern: str) -> str:
    # The first string generated (no shrinking: it is slow on these patterns), the same every run.
    return find(st.from_regex(pattern, fullmatch=True), lambda _: True,
                settings=settings(database=None, derandomize=True, phases=[Phase.generate],
                                  suppress_health_check=list(HealthCheck)))


def minimal(schema: dict, doc: dict):
    """The smallest instance the schema allows: required members only, first alternatives, lower bounds."""
    schema = _resolve(schema, doc)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for combinator in ("anyOf", "oneOf"):
        if combinator in schema:
            first = next(s for s in schema[combinator] if s.get("type") != "null")
            return minimal(first, doc)
    kind = schema.get("type", "object")
    if kind == "object":
        return {name: minimal(schema["properties"][name], doc) for name in schema.get("required", [])}
    if kind == "array":
        return [minimal(schema.get("items", {}), doc) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        if "pattern" in schema:
            return _matching(schema["pattern"])
        return "x" * max(1, schema.get("minLength", 1))
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    raise AssertionError(f"no minimal instance for {schema}")


def beyond(schema: dict, doc: dict):
    """Values the member's schema forbids: a wrong type, and each documented bound passed by one."""
    schema = _resolve(schema, doc)
    kind = schema.get("type")
    yield 12345 if kind == "string" else "not of the documented type"
    if kind == "integer":
        if "minimum" in schema:
            yield schema["minimum"] - 1
        if "maximum" in schema:
            yield schema["maximum"] + 1
    if kind == "string" and schema.get("minLength", 0) > 0:
        yield ""
    if kind == "array":
        item = minimal(schema.get("items", {}), doc)
        distinct = [f"{item}{i}" for i in range(schema.get("maxItems", 0) + 1)] if isinstance(item, str) else None
        if schema.get("minItems", 0) > 0:
            yield []
        if "maxItems" in schema:
            yield distinct or [item] * (schema["maxItems"] + 1)
        if schema.get("uniqueItems"):
            yield [item, item]


def _fill(path: str) -> str:
    return re.sub(r"\{\w+\}", "absent-id", path)


def _json_bodies(doc: dict):
    for method, path, op in _keyed(doc):
        content = op.get("requestBody", {}).get("content", {})
        if "application/json" in content:
            yield method, path, op, content["application/json"]["schema"]


def test_a_body_valid_by_the_document_is_not_refused_as_invalid(doc, api):
    checked = []
    for method, path, op, schema in _json_bodies(doc):
        body = minimal(schema, doc)
        jsonschema.validate(body, {**_resolve(schema, doc), "components": doc["components"]})
        r = api.request(method, _fill(path), json=body)
        assert r.status_code != 400 and r.json().get("code") != "invalid_schema", (op["operationId"], body, r.text)
        if not op["requestBody"]["required"]:  # an optional body may be absent (empty)
            r = api.request(method, _fill(path), content=b"")
            assert r.status_code not in (400, 422), (op["operationId"], r.text)
            # but white space alone is no JSON text: not even RFC 8259's (make fuzz, seed 45, took
            # " " for an absent body), nor a vertical tab (seed 11)
            for blank in (b" ", b" \r\n\t", b"\x0b"):
                assert_error(api.request(method, _fill(path), content=blank), 400, "malformed_json")
        checked.append(op["operationId"])
    assert sorted(checked) == sorted([
        "ingestRecord", "withdrawRecord", "ingestBatch", "searchRecords", "createCorpus", "createUpload",
        "confirmUpload", "cancelOperation", "rerunOperation", "resumeOperation", "configureRetrieval",
        "rebuildCorpusProjection", "registerPlugin", "activatePlugin", "rollbackPlan",
        "createSavedQuery", "createSavedQueryVersion", "deleteSavedQuery", "renameSavedQuery", "createSubscription",
        "createSubscriptionVersion", "deleteSubscription", "disableSubscription", "enableSubscription",
        "renameSubscription", "previewSubscription", "migrateSubscriptionEvaluators", "createConnector",
        "disableConnector", "replaceConnectorCredential", "changeConnectorSchedule", "requestConnectorRun",
        "createInstanceToken", "revokeInstanceToken"])


def test_a_body_breaking_the_document_is_refused_with_a_pointer(doc, api):
    for method, path, op, schema in _json_bodies(doc):
        component = _resolve(schema, doc)
        valid = minimal(schema, doc)
        for name in component.get("required", []):
            for value in beyond(component["properties"][name], doc):
                r = api.request(method, _fill(path), json={**valid, name: value})
                # 413 where the bound is a size limit (size_bytes, the batch's entries), else 422.
                assert r.status_code in (413, 422), (op["operationId"], name, value, r.text)
                assert r.json()["field"] == f"/{name}", (op["operationId"], name, r.text)
                # part 2 ScheduleChange: an interval outside the floor..86400 is its own code
                assert r.json()["code"] in ("invalid_schema", "request_too_large", "batch_too_large",
                                            "invalid_interval"), r.text
        r = api.request(method, _fill(path), json={**valid, "undocumented_member": 1})
        assert r.status_code == 422 and r.json()["field"] == "/undocumented_member", (op["operationId"], r.text)


def test_query_parameters_are_held_to_their_documented_bounds(doc, api):
    checked = []
    for method, path, op in _keyed(doc):
        query = [p for p in op["parameters"] if p["in"] == "query"]
        base = {p["name"]: minimal(p["schema"], doc) for p in query if p["required"]}
        for param in query:
            name, schema = param["name"], param["schema"]
            if param["required"]:
                r = api.request(method, _fill(path), params={k: v for k, v in base.items() if k != name})
                assert r.status_code == 422 and r.json()["field"] == f"/{name}", (op["operationId"], r.text)
            if param.get("allowEmptyValue"):  # an empty value is the parameter left out
                r = api.request(method, _fill(path), params={**base, name: ""})
                assert r.json().get("code") != "invalid_input", (op["operationId"], name, r.text)
            if "enum" in schema:  # each listed value is accepted, any other refused (decisions.md Bad input)
                for value in schema["enum"]:
                    r = api.request(method, _fill(path), params={**base, name: value})
                    assert r.json().get("code") != "invalid_input", (op["operationId"], name, value, r.text)
                r = api.request(method, _fill(path), params={**base, name: "not-a-listed-value"})
                assert r.status_code == 422 and r.json()["code"] == "invalid_input", (op["operationId"], name, r.text)
                assert r.json()["field"] == f"/{name}"
                checked.append((op["operationId"], name))
            if schema.get("type") != "integer":
                continue
            for edge in (schema["minimum"], schema["maximum"]):  # documented: accepted
                r = api.request(method, _fill(path), params={**base, name: edge})
                assert r.json().get("code") != "invalid_input", (op["operationId"], name, edge, r.text)
            for beyond in (schema["minimum"] - 1, schema["maximum"] + 1, "ten"):  # not documented: refused
                r = api.request(method, _fill(path), params={**base, name: beyond})
                assert r.status_code == 422, (op["operationId"], name, beyond, r.text)
                assert r.json()["code"] == "invalid_input" and r.json()["field"] == f"/{name}"
            checked.append((op["operationId"], name))
    assert sorted(checked) == [("listConnectorRuns", "limit"), ("listConnectorRuns", "state"),
                               ("listConnectors", "enabled"), ("listConnectors", "limit"), ("listCorpora", "limit"),
                               ("listDeliveryAttempts", "limit"), ("listMatches", "limit"), ("listMatches", "state"),
                               ("listPlans", "limit"), ("listRecords", "limit"), ("listSubscriptions", "limit"),
                               ("pollChanges", "limit")]


def test_options_on_every_documented_path_names_exactly_its_documented_methods(doc, server):
    # RFC 9110 section 9.3.7: OPTIONS answers with Allow; the document states what each path accepts,
    # so Allow lists exactly its documented methods (GET /v0/records beside POST included).
    for path, ops in doc["paths"].items():
        documented = {m.upper() for m in ops} | {"OPTIONS"}
        r = httpx.options(f"{server.base_url}{_fill(path)}")
        assert r.status_code == 204, (path, r.text)
        assert set(r.headers["allow"].split(", ")) == documented, (path, r.headers["allow"])
        undocumented = next((m for m in ("DELETE", "PATCH", "PUT", "POST") if m not in documented), None)
        if undocumented is None:
            continue  # a Connector's push path takes every method; its declared route decides (405 there)
        r = httpx.request(undocumented, f"{server.base_url}{_fill(path)}")
        assert r.status_code == 405 and r.json()["code"] == "method_not_allowed", (path, r.text)
        assert set(r.headers["allow"].split(", ")) == documented, (path, r.headers["allow"])


def test_extension_namespaces_are_exactly_the_documented_ones(doc, api):
    # part1 Manifest content: a command carries only declared namespaces at an installed schema
    # version; the document lists them, so what it allows is accepted and what it forbids refused.
    extensions = doc["components"]["schemas"]["IngestCommand"]["properties"]["extensions"]["anyOf"][0]
    assert extensions["additionalProperties"] is False
    corpus = create_corpus(api)
    for namespace, schema in extensions["properties"].items():
        for version in schema["properties"]["schema_version"]["enum"]:
            body = text_command(corpus, f"ext-{namespace}", "text",
                                extensions={namespace: {"schema_version": version, "data": {}}})
            jsonschema.validate(body, {**_resolve({"$ref": "#/components/schemas/IngestCommand"}, doc),
                                       "components": doc["components"]})
            r = api.post("/v0/records", json=body)
            assert r.status_code == 202, r.text
        r = api.post("/v0/records", json=text_command(
            corpus, f"ext-{namespace}-v", "text", extensions={namespace: {"schema_version": "0.0-absent", "data": {}}}))
        assert r.status_code == 422 and r.json()["field"] == f"/extensions/{namespace}/schema_version", r.text
    r = api.post("/v0/records", json=text_command(
        corpus, "ext-undocumented", "text", extensions={"undocumented": {"schema_version": "1", "data": {}}}))
    assert r.status_code == 422 and r.json()["field"] == "/extensions/undocumented", r.text


def test_a_retrieval_field_source_pointer_is_documented_as_the_roots_the_service_takes(doc, api):
    # part 1 Corpus retrieval mapping: a source_pointer is rooted at /manifest, /provenance or
    # /extensions/{declared namespace}, else 422 invalid_mapping; the document's pattern says the same.
    pattern = doc["components"]["schemas"]["FieldMapping"]["properties"]["source_pointer"]["pattern"]
    pointers = ("/manifest", "/manifest/title", "/provenance/source_url", "/extensions/example/data/tags",
                "/manifestx", "/extensions/undeclared/data", "/extensions", "manifest/title", "/links/0",
                "x/extensions/example/data")
    for n, pointer in enumerate(pointers):
        field = {"name": "f", "source_pointer": pointer, "type": "string", "roles": ["search"]}
        r = api.post("/v0/corpora", json={"idempotency_key": f"pointer-{n}", "corpus_id": f"pointer-{n}",
                                          "name": "Pointers",
                                          "retrieval": {"plugin_profile": "default", "fields": [field]}})
        documented = re.search(pattern, pointer) is not None
        assert (r.json().get("code") != "invalid_mapping") is documented, (pointer, r.text)
        assert r.status_code in ((200, 201) if documented else (422,)), (pointer, r.text)
