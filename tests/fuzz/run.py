"""`make fuzz`: Schemathesis over the served OpenAPI document against a real server.

Starts `contentsvc run` on a scratch database (on CONTENTSVC_TEST_DATABASE_URL's
server, else an embedded PostgreSQL), with a startup file that launches the fixture evaluator,
names a loopback destination nobody listens on and enables the built-in `fixture` connector kind
(nothing the run does leaves the machine). It creates a key holding every action (the operator's
included), seeds a Corpus, a Record, a verified Blob, an Operation, a Saved Query, a Subscription
with a Match and its Delivery, a Connector with a run and an instance token, so that generated
requests reach real resources of part 1 and part 2 (and one more of those an operation deletes,
disables, revokes or gives a new Version, for that operation alone, so that the first ones stay
live); it also offers the fixture kind's push route paths, a credential its schema accepts and the
pinned evaluator's manifest and endpoint as values. Then it runs
Schemathesis with a fixed seed and a bounded number of cases per operation. Any server error or
any answer the document does not describe fails the run (exit status 1).

The checks and their exceptions are in tests/fuzz/schemathesis.toml, the body hooks in tests/fuzz/hooks.py.

Usage: python tests/fuzz/run.py [--seed N] [--max-examples N] [--workers N] [--keep]
"""

from __future__ import annotations

import argparse
import atexit
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import psycopg

import contentsvc_plugins
from contentsvc.auth import keys
from contentsvc.processes.local_service import LocalService, create_database, drop_database, free_port
from contentsvc.storage.migrations import migrate

SEED = 20260101
MAX_EXAMPLES = 30  # per operation and phase: one to two minutes on two shared cores
SEEDED_CORPUS = "fuzz-corpus"
OPENAPI_PATH = "/schema/openapi.json"
CONFIG = Path(__file__).with_name("schemathesis.toml")
HOOKS = Path(__file__).with_name("hooks.py")  # bodies of the shapes a Connector's kind declares
# An idle change stream checkpoints every second, so a fuzzed stream ends after a few events.
SERVER_ENV = {"CONTENTSVC_STREAM_CHECKPOINT_SECONDS": "1"}
EVALUATOR_MANIFEST = Path(contentsvc_plugins.__file__).with_name("fixture_evaluator") / "contentsvc-plugin.json"
DESTINATION = "hooks"


def startup_file(folder: Path) -> Path:
    """The fixture evaluator pinned and launched, a destination on a loopback port nobody listens on
    (its deliveries fail and are retried, on this machine only) and the `fixture` connector kind,
    which reads its items from its own configuration: no fuzzed request reaches another machine."""
    config = folder / "contentsvc.toml"
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    config.write_text(
        f'[plugins.fixture-evaluator]\nendpoint = "http://127.0.0.1:{free_port()}"\nversion = "0.1.0"\n'
        f'manifest = "{EVALUATOR_MANIFEST}"\nlaunch = "fixture-evaluator"\n\n'
        f'[destinations.{DESTINATION}]\nurl = "http://127.0.0.1:{free_port()}/hooks"\nsecret = "{secret}"\n\n'
        f'[connectors]\nfixture_enabled = true\n'
        f'credential_key = "{base64.b64encode(os.urandom(32)).decode()}"\n')
    return config


def admin_database(scratch: Path) -> str:
    url = os.environ.get("CONTENTSVC_TEST_DATABASE_URL")
    if url:
        return url
    from contentsvc.storage.database import start_embedded

    # Its own directory, removed at exit after the embedded server stops (atexit runs in reverse).
    home = Path(tempfile.mkdtemp(prefix="contentsvc-fuzz-pg-"))
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return start_embedded(home)


def operator_key(database_url: str, org: str) -> str:
    """A key with every action, the operator's included, on every Corpus."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return keys.create_key(conn, org, keys.parse_actions("*", operator=True), None, "fuzz").secret


def seed(base_url: str, secret: str) -> dict[str, list]:
    """Real resources for the generated requests, of every kind a path names by id. Returns their
    ids by the name the document gives the parameter that carries them (`version_id` names the
    Versions of a Record, a Saved Query and a Subscription alike)."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as api:
        def call(method: str, path: str, **kwargs) -> dict:
            r = api.request(method, path, **kwargs)
            r.raise_for_status()
            return r.json()

        def until(path: str, done, what: str) -> dict:
            deadline = time.monotonic() + 30
            while not done(answer := call("GET", path)):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the seeded {what} never settled: {answer}")
                time.sleep(0.1)
            return answer

        content = b"fuzz upload"
        digest = hashlib.sha256(content).hexdigest()

        def upload(key: str) -> dict:
            return call("POST", "/v0/uploads", json={"idempotency_key": key, "media_type": "text/plain",
                                                    "size_bytes": len(content), "sha256": digest})

        def saved_query(key: str, name: str) -> dict:
            return call("POST", "/v0/saved-queries", json={
                "idempotency_key": key, "name": name, "corpus_ids": [SEEDED_CORPUS],
                "expression": {"contains": "fuzzer"}})

        def subscription(key: str, name: str, query: dict) -> dict:
            return call("POST", "/v0/subscriptions", json={
                "idempotency_key": key, "name": name, "saved_query_version_id": query["current_version_id"],
                "destination_id": DESTINATION,
                "evaluator": {"plugin_id": "fixture-evaluator", "version": "0.1.0", "configuration": {}}})

        def connector(key: str, namespace: str, items: list[dict]) -> dict:
            return call("POST", "/v0/connectors", json={
                "idempotency_key": key, "corpus_id": SEEDED_CORPUS, "source_namespace": namespace,
                "kind": "fixture", "config": {"items": items}, "schedule": {"interval_seconds": 3600}})

        def token(of: dict, key: str, name: str) -> dict:
            return call("POST", f"/v0/connectors/{of['connector_id']}/instance-tokens",
                        json={"idempotency_key": key, "name": name})

        call("POST", "/v0/corpora", json={"idempotency_key": "fuzz-corpus", "corpus_id": SEEDED_CORPUS,
                                         "name": "Fuzzed corpus"})
        receipt = call("POST", "/v0/records", json={
            "idempotency_key": "fuzz-record",
            "source": {"corpus_id": SEEDED_CORPUS, "namespace": "fuzz", "record_key": "first"},
            "content": {"kind": "text", "text": "A record the fuzzer can read, list and search."},
        })
        receipt = until(f"/v0/ingestion-receipts/{receipt['receipt_id']}", lambda r: r["state"] == "resolved",
                        "record")
        verified = upload("fuzz-upload")
        httpx.put(verified["put_url"], content=content, headers=verified["put_headers"],
                  timeout=30).raise_for_status()
        call("POST", f"/v0/uploads/{verified['upload_id']}/confirm")
        until(f"/v0/uploads/{verified['upload_id']}", lambda u: u["state"] in ("verified", "failed"), "upload")
        # and one awaiting its bytes, whose presigned URL's expires and signature the fuzzer is given
        waiting = upload("fuzz-upload-waiting")
        presigned = dict(parse_qsl(urlsplit(waiting["put_url"]).query))
        rebuild = call("POST", f"/v0/corpora/{SEEDED_CORPUS}/rebuilds", json={"idempotency_key": "fuzz-rebuild"})

        query = saved_query("fuzz-saved-query", "Fuzzed query")
        alerts = subscription("fuzz-subscription", "Fuzzed alerts", query)
        # A Record ingested after the Subscription is evaluated for it: a Match, and its Delivery
        call("POST", "/v0/records", json={
            "idempotency_key": "fuzz-record-matching",
            "source": {"corpus_id": SEEDED_CORPUS, "namespace": "fuzz", "record_key": "second"},
            "content": {"kind": "text", "text": "Another record the fuzzer finds."}})
        matches = until(f"/v0/matches?subscription_id={alerts['subscription_id']}",
                        lambda m: m["items"] and m["items"][0]["deliveries"], "match")["items"]
        feed = connector("fuzz-connector", "fuzz-feed",
                         [{"record_key": "item-1", "revision": "1", "text": "An item of the fuzzed connector."}])
        runs = until(f"/v0/connectors/{feed['connector_id']}/runs", lambda r: r["items"], "connector run")["items"]
        feed_token = token(feed, "fuzz-token", "fuzz")
        # One more of each resource an operation can end (delete, disable, revoke), and a Saved Query
        # to take new Versions: those operations are given these (ENDING_OPERATIONS), so that the
        # others reach live resources, and the first Saved Query's Version stays current, all run long.
        ending_query = saved_query("fuzz-saved-query-ending", "Fuzzed query to end")
        revised_query = saved_query("fuzz-saved-query-revised", "Fuzzed query to revise")
        ending_subscription = subscription("fuzz-subscription-ending", "Fuzzed alerts to end", ending_query)
        ending_connector = connector("fuzz-connector-ending", "fuzz-feed-ending", [])
        ending_token = token(feed, "fuzz-token-ending", "fuzz to end")
        registrations = call("GET", "/v0/admin/plugins")["items"]  # the pinned evaluator, registered at start
        plans = call("GET", "/v0/admin/plugins/plans")["items"]
        return {
            "corpus_id": [SEEDED_CORPUS], "record_id": [receipt["record_id"]], "receipt_id": [receipt["receipt_id"]],
            "version_id": [receipt["version_id"], query["current_version_id"], alerts["current_version_id"]],
            "upload_id": [verified["upload_id"]], "blob_id": [verified["blob_id"]],
            "waiting_upload_id": [waiting["upload_id"]], "upload_expires": [int(presigned["expires"])],
            "upload_signature": [presigned["signature"]], "upload_sha256": [digest],
            "operation_id": [rebuild["operation_id"]],
            "saved_query_id": [query["saved_query_id"]],
            "saved_query_version_id": [query["current_version_id"]],
            "subscription_id": [alerts["subscription_id"]],
            "destination_id": [DESTINATION],
            "match_id": [matches[0]["match_id"]],
            "delivery_id": [matches[0]["deliveries"][0]["delivery_id"]],
            "connector_id": [feed["connector_id"]], "run_id": [runs[0]["run_id"]],
            "token_id": [feed_token["token_id"]],
            "registration_id": [r["registration_id"] for r in registrations],
            "plan_id": [plan["plan_id"] for plan in plans],
            # what the deployment serves: connectors of this kind and Subscriptions of this evaluator
            "connector_kind": ["fixture"], "evaluator_plugin_id": ["fixture-evaluator"],
            "evaluator_version": ["0.1.0"],
            "ending_saved_query_id": [ending_query["saved_query_id"]],
            "revised_saved_query_id": [revised_query["saved_query_id"]],
            "ending_subscription_id": [ending_subscription["subscription_id"]],
            "ending_connector_id": [ending_connector["connector_id"]],
            "ending_token_id": [ending_token["token_id"]],
            # the fixture kind's declared push routes (one each: instance token, service key, signature)
            # and a secret its credential schema accepts, so that those requests get past the
            # route lookup and the schema to the code behind them
            "push_route_path": ["ingest_key", "ingest", "signed"],
            "credential_token": ["fuzz-credential"],
            # the pinned evaluator's own manifest text and endpoint: a registration that can pass
            "plugin_manifest": [EVALUATOR_MANIFEST.read_text()],
            "plugin_endpoint": [r["endpoint"] for r in registrations],
        }


# Where the document carries each seeded id, as Schemathesis names the place.
SEEDED_PLACES = {
    "corpus_id": ["path.corpus_id", "query.corpus_id", "body.source.corpus_id", "body.corpus_ids[*]",
                  "body.entries[*].source.corpus_id"],
    **{name: [f"path.{name}"] for name in
       ("record_id", "version_id", "receipt_id", "upload_id", "blob_id", "operation_id", "saved_query_id",
        "match_id", "delivery_id", "connector_id", "run_id", "token_id", "registration_id")},
    "saved_query_version_id": ["body.saved_query_version_id", "query.saved_query_version_id"],
    "subscription_id": ["path.subscription_id", "query.subscription_id"],
    "destination_id": ["body.destination_id"],
    "plan_id": ["path.plan_id", "body.plan_id"],
    "connector_kind": ["body.kind"],
    "evaluator_plugin_id": ["body.evaluator.plugin_id", "body.plugin_id"],
    "evaluator_version": ["body.evaluator.version", "body.from_version"],
    "push_route_path": ["path.path"],
    "credential_token": ["body.secret.token"],
    "plugin_manifest": ["body.manifest"],
    "plugin_endpoint": ["body.endpoint"],
}
SEEDED_SHARE = 0.5  # half the generated values of those places are the seeded ids, half are generated
# The presigned PUT gets the upload awaiting its bytes (its id, its URL's expires and signature,
# its digest) in place of the dictionaries above, so that generated PUTs get past the signature to
# the checks of the bytes.
PRESIGNED_PUT = {"PUT /v0/uploads/{upload_id}/content": {
    "waiting_upload_id": "path.upload_id", "upload_expires": "query.expires",
    "upload_signature": "query.signature", "upload_sha256": "header.x-content-sha256"}}
# An operation that ends a resource, or makes a seeded Version no longer current, gets the seeded
# one kept for it, and not the ids Schemathesis reads from earlier answers (the first seeded ones
# among them).
ENDING_OPERATIONS = {
    "POST /v0/saved-queries/{saved_query_id}/delete": {"ending_saved_query_id": "path.saved_query_id"},
    "POST /v0/saved-queries/{saved_query_id}/versions": {"revised_saved_query_id": "path.saved_query_id"},
    "POST /v0/subscriptions/{subscription_id}/delete": {"ending_subscription_id": "path.subscription_id"},
    "POST /v0/subscriptions/{subscription_id}/disable": {"ending_subscription_id": "path.subscription_id"},
    "POST /v0/connectors/{connector_id}/disable": {"ending_connector_id": "path.connector_id"},
    "POST /v0/connectors/{connector_id}/instance-tokens/{token_id}/revoke": {"ending_token_id": "path.token_id"},
}
NO_IDS_FROM_ANSWERS = [f"phases.{phase}.extra-data-sources.responses = false"
                       for phase in ("examples", "coverage", "fuzzing")]


def write_config(path: Path, seeded: dict[str, list]) -> None:
    """The static configuration, plus dictionaries that put the seeded ids where the document takes them."""
    lines = [CONFIG.read_text(), ""]
    for name, values in seeded.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(values)}", ""]
    def draw(place: str, name: str) -> str:
        return f'{json.dumps(place)} = {{ dictionary = "{name}", probability = {SEEDED_SHARE} }}'

    lines.append("[parameters]")
    lines += [draw(place, name) for name, places in SEEDED_PLACES.items() for place in places]
    for operation, places in {**PRESIGNED_PUT, **ENDING_OPERATIONS}.items():
        lines += ["", "[[operations]]", f"include-name = {json.dumps(operation)}"]
        lines += NO_IDS_FROM_ANSWERS if operation in ENDING_OPERATIONS else []
        lines += ["[operations.parameters]"] + [draw(place, name) for name, place in places.items()]
    path.write_text("\n".join(lines) + "\n")


def schemathesis(base_url: str, secret: str, args: argparse.Namespace, config: Path, report: Path) -> int:
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{base_url}{OPENAPI_PATH}",
        "--url", base_url,
        "--header", f"Authorization: Bearer {secret}",
        "--seed", str(args.seed),
        "--max-examples", str(args.max_examples),
        "--workers", str(args.workers),
        "--generation-database", "none",
        "--request-timeout", "30",
        "--report", "ndjson",
        "--report-ndjson-path", str(report),
        "--no-color",
    ]
    print("$", " ".join("Authorization: Bearer ***" if c.startswith("Authorization") else c for c in command),
          flush=True)
    # Run in the scratch directory: Schemathesis keeps a cache beside it, which would carry one run's
    # findings into the next and make the fixed seed no longer decide the run.
    return subprocess.run(command, cwd=report.parent, env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}).returncode


def count_cases(report: Path) -> tuple[int, int]:
    """(cases run, failures) from the run's ndjson events: each scenario's recorded checks."""
    cases: set[str] = set()
    failures: set[str] = set()
    if not report.exists():  # Schemathesis stopped before testing (a schema or configuration error)
        return 0, 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for name, body in event.items():
            if name != "ScenarioFinished":
                continue
            recorder = body.get("recorder") or {}
            for case_id in (recorder.get("cases") or {}):
                cases.add(case_id)
            for case_id, checks in (recorder.get("checks") or {}).items():
                if any(c.get("status") == "failure" for c in checks):
                    failures.add(case_id)
    return len(cases), len(failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--max-examples", type=int, default=MAX_EXAMPLES)
    # One worker: two would race in CPython 3.11's ast module inside Hypothesis, and one keeps
    # the order of requests, so the seed alone decides the run.
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the server log and the events file")
    args = parser.parse_args()

    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="contentsvc-fuzz-"))
    admin_url = admin_database(scratch)
    database_url = create_database(admin_url, "csfuzz")
    service = None
    failed = None
    try:
        migrate(database_url)
        secret = operator_key(database_url, f"fuzz-{uuid.uuid4().hex[:8]}")
        service = LocalService(database_url, scratch / "server.log", scratch / "home",
                               {**SERVER_ENV, "CONTENTSVC_CONFIG": str(startup_file(scratch))})
        write_config(scratch / "schemathesis.toml", seed(service.base_url, secret))
        status = schemathesis(service.base_url, secret, args, scratch / "schemathesis.toml",
                              scratch / "events.ndjson")
        cases, failures = count_cases(scratch / "events.ndjson")
        print(f"fuzz: {cases} cases, {failures} failing, seed {args.seed}, {args.max_examples} examples per "
              f"operation, {time.monotonic() - started:.0f} s; exit status {status}", flush=True)
        failed = status != 0
        if failed or args.keep:
            print(f"server log and events: {scratch}", flush=True)
        return 1 if failed else 0
    finally:
        if service is not None:
            service.stop()
        drop_database(admin_url, database_url)
        if failed is False and not args.keep:  # a failing run keeps its server log for reading
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
