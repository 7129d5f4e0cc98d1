"""`make fuzz`: Schemathesis over the served OpenAPI document against a real server.

Starts `contentsvc run` on a scratch database (on CONTENTSVC_TEST_DATABASE_URL's
server, else an embedded PostgreSQL), creates a key holding every action
(the operator's included), seeds a Corpus, a Record, a verified Blob and an
Operation so that generated requests reach real resources, then runs
Schemathesis with a fixed seed and a bounded number of cases per operation. Any server error or
any answer the document does not describe fails the run (exit status 1).

Usage: python tests/fuzz/run.py [--seed N] [--max-examples N] [--workers N] [--keep]
"""

from __future__ import annotations

import argparse
import atexit
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

import httpx
import psycopg

from contentsvc.auth import keys
from contentsvc.processes.local_service import LocalService, create_database, drop_database
from contentsvc.storage.migrations import migrate

SEED = 20260101
MAX_EXAMPLES = 30  # per operation and phase: about three and a half minutes on two shared cores
CHECKS = ",".join([
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
    "content_type_conformance",
])
SEEDED_CORPUS = "fuzz-corpus"
OPENAPI_PATH = "/schema/openapi.json"
CONFIG = Path(__file__).with_name("schemathesis.toml")
# An idle change stream checkpoints every second, so a fuzzed stream ends after a few events.
SERVER_ENV = {"CONTENTSVC_STREAM_CHECKPOINT_SECONDS": "1"}


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


def seed(base_url: str, secret: str) -> dict[str, str]:
    """A Corpus, a Record in it, a verified Blob and an Operation: real resources for the generated
    requests. Returns their ids by the name the document gives the parameter that carries them."""
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

        call("POST", "/v0/corpora", json={"idempotency_key": "fuzz-corpus", "corpus_id": SEEDED_CORPUS,
                                         "name": "Fuzzed corpus"})
        receipt = call("POST", "/v0/records", json={
            "idempotency_key": "fuzz-record",
            "source": {"corpus_id": SEEDED_CORPUS, "namespace": "fuzz", "record_key": "first"},
            "content": {"kind": "text", "text": "A record the fuzzer can read, list and search."},
        })
        receipt = until(f"/v0/ingestion-receipts/{receipt['receipt_id']}", lambda r: r["state"] == "resolved",
                        "record")
        content = b"fuzz upload"
        upload = call("POST", "/v0/uploads", json={"idempotency_key": "fuzz-upload", "media_type": "text/plain",
                                                  "size_bytes": len(content),
                                                  "sha256": hashlib.sha256(content).hexdigest()})
        httpx.put(upload["put_url"], content=content, headers=upload["put_headers"], timeout=30).raise_for_status()
        call("POST", f"/v0/uploads/{upload['upload_id']}/confirm")
        until(f"/v0/uploads/{upload['upload_id']}", lambda u: u["state"] in ("verified", "failed"), "upload")
        rebuild = call("POST", f"/v0/corpora/{SEEDED_CORPUS}/rebuilds", json={"idempotency_key": "fuzz-rebuild"})
        return {
            "corpus_id": SEEDED_CORPUS, "record_id": receipt["record_id"], "version_id": receipt["version_id"],
            "receipt_id": receipt["receipt_id"], "upload_id": upload["upload_id"], "blob_id": upload["blob_id"],
            "operation_id": rebuild["operation_id"],
        }


# Where the document carries each seeded id, as Schemathesis names the place.
SEEDED_PLACES = {
    "corpus_id": ["path.corpus_id", "query.corpus_id", "body.source.corpus_id", "body.corpus_ids[*]",
                  "body.entries[*].source.corpus_id"],
    **{name: [f"path.{name}"] for name in
       ("record_id", "version_id", "receipt_id", "upload_id", "blob_id", "operation_id")},
}
SEEDED_SHARE = 0.5  # half the generated values of those places are the seeded ids, half are generated


def write_config(path: Path, seeded: dict[str, str]) -> None:
    """The static configuration, plus dictionaries that put the seeded ids where the document takes them."""
    lines = [CONFIG.read_text(), ""]
    for name, value in seeded.items():
        lines += [f"[dictionaries.{name}]", f"values = [{json.dumps(value)}]", ""]
    lines.append("[parameters]")
    for name, places in SEEDED_PLACES.items():
        lines += [f'{json.dumps(place)} = {{ dictionary = "{name}", probability = {SEEDED_SHARE} }}'
                  for place in places]
    path.write_text("\n".join(lines) + "\n")


def schemathesis(base_url: str, secret: str, args: argparse.Namespace, config: Path, report: Path) -> int:
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{base_url}{OPENAPI_PATH}",
        "--url", base_url,
        "--header", f"Authorization: Bearer {secret}",
        "--seed", str(args.seed),
        "--max-examples", str(args.max_examples),
        "--checks", CHECKS,
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
    return subprocess.run(command, cwd=report.parent).returncode


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
                if any(c.get("status") == "FAILURE" for c in checks):
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
        service = LocalService(database_url, scratch / "server.log", scratch / "home", SERVER_ENV)
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
