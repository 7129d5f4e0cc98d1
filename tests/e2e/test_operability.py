"""What an operator sees: CLI keys, projector status, OpenAPI, logs, outages."""

import json
import os
import time

import httpx
import psutil
import psycopg

from contentsvc.processes.registry import WORKER, of_role
from tests.conftest import (ServerProcess, assert_error, client_for, create_corpus, json_lines, key_for,
                            operator_cli, status_table_rows, text_command, until, worker_status_rows)


def test_keys_cli_create_json_list_and_revoke(server, database_url):
    # decisions.md Operator: keys create --json prints one object on stdout and nothing else
    out = operator_cli(database_url, "keys", "create", "--org", "cli-org", "--actions", "corpora:read,corpora:write",
              "--corpora", "*", "--json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert set(created) == {"key_id", "secret", "org", "actions", "corpora"}
    assert created["secret"].startswith("csk_") and created["corpora"] == "*"
    with client_for(server, created["secret"]) as client:
        assert client.get("/v0/corpora").status_code == 200
        listed = operator_cli(database_url, "keys", "list")
        assert created["key_id"] in listed.stdout and created["secret"] not in listed.stdout
        with psycopg.connect(database_url) as conn:  # only a hash is stored at rest
            stored = conn.execute("SELECT secret_hash FROM api_keys WHERE key_id = %s", (created["key_id"],)).fetchone()
            assert created["secret"].encode() not in bytes(stored[0])
        assert operator_cli(database_url, "keys", "revoke", created["key_id"]).returncode == 0
        assert_error(client.get("/v0/corpora"), 401, "invalid_api_key")  # next request


def test_keys_cli_refuses_unknown_actions(database_url):
    out = operator_cli(database_url, "keys", "create", "--org", "x", "--actions", "content:read,plugins:admin",
              "--corpora", "*")
    assert out.returncode != 0 and "plugins:admin" in out.stderr


def test_keys_cli_refuses_an_organization_or_corpus_id_that_cannot_be_one(database_url):
    # part1 Security rule 2: the key's Organization scopes every access, so an empty or spaced one
    # is a typo; a key scoped to `News` would reach no Corpus (decisions.md CorpusRequest pattern).
    with psycopg.connect(database_url) as conn:
        before = conn.execute("SELECT count(*) FROM api_keys").fetchone()[0]
    for org, corpora, named in (("", "*", "--org ''"), ("acme corp", "*", "--org 'acme corp'"),
                                ("acme", "news,News", "not a corpus id: News")):
        out = operator_cli(database_url, "keys", "create", "--org", org, "--actions", "*", "--corpora", corpora)
        assert out.returncode == 2 and named in out.stderr, out.stderr
        assert "database:" not in out.stderr  # refused before any database is opened
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM api_keys").fetchone()[0] == before


def test_one_shot_commands_name_an_unreachable_database_in_one_line():
    # Errors (operator edge): a database that refuses connections is one line naming it, with its
    # password masked, and exit 1; no traceback, no critical log line. Port 1 on loopback refuses.
    unreachable = "postgresql://operator:hunter2@127.0.0.1:1/contentsvc"
    for command in (["keys", "list"], ["migrate"], ["gc"], ["projector", "status"], ["worker", "status"],
                    ["credentials", "rewrap"]):
        out = operator_cli(unreachable, *command)
        assert out.returncode == 1, (command, out.stderr)
        errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "cannot connect to the database" in errors[0], out.stderr
        assert "operator:***@127.0.0.1:1" in errors[0] and "Connection refused" in errors[0]
        assert "hunter2" not in out.stderr + out.stdout and "Traceback" not in out.stderr, out.stderr
        assert "uncaught_exception" not in out.stderr + out.stdout


def running_column(status: str) -> dict[str, str]:
    return {row["projector"]: row["running"] for row in status_table_rows(status)}


def test_projector_status_shows_position_and_lag(server, database_url, api):
    corpus = create_corpus(api)
    api.post("/v0/records", json=text_command(corpus, "k", "status"))
    out = operator_cli(database_url, "projector", "status")
    assert out.returncode == 0, out.stderr
    assert "materializer" in out.stdout and "readmodel" in out.stdout and "journal head" in out.stdout
    # Every projector of the running server holds its lock: each row says so.
    running = running_column(out.stdout)
    assert running["materializer"] == running["readmodel"] == running["lexical"] == "yes", out.stdout


def test_projector_status_says_when_no_projector_runs(databases):
    url = databases.create()  # migrated; no server runs on it
    out = operator_cli(url, "projector", "status")
    assert out.returncode == 0, out.stderr
    running = running_column(out.stdout)
    assert set(running) >= {"materializer", "readmodel", "lexical", "vectors"}
    assert set(running.values()) == {"no"}, out.stdout


def test_worker_status_shows_each_worker_running_and_its_queue(server, database_url):
    # Operator edge: workers keep their queues in tables, not as a journal position, so
    # `projector status` cannot show them; `worker status` names every worker of the registry.
    rows = worker_status_rows(database_url)
    assert set(rows) == set(of_role(WORKER)), rows
    assert {rows[name]["running"] for name in ("gc", "plugins", "monitor", "connectors")} == {"yes"}, rows
    assert rows["deliveries"]["running"] == "yes (1 process)", rows  # row leases: no lock to hold
    assert rows["monitor"]["position"].isdigit() and rows["monitor"]["lag (events)"].isdigit(), rows
    assert rows["deliveries"]["waiting"].endswith(" held") and rows["gc"]["waiting"] == "-", rows


def test_worker_status_says_when_no_worker_runs(databases):
    url = databases.create()  # migrated; no server runs on it
    rows = worker_status_rows(url)
    assert {row["running"] for row in rows.values()} == {"no"}, rows
    assert rows["connectors"]["waiting"] == "0 runs queued, 0 running", rows
    assert rows["monitor"]["waiting"] == "0 evaluations pending (0 due)", rows


def test_the_log_names_what_the_server_lacks(server, database_url):
    # README "Set up and run": a server of one's own keeps autovacuum on, and commits are durable
    # before a 202 (part 1 rule 1). Where a setting says otherwise (this machine's server runs
    # without autovacuum), the gc worker says so at start, with what it costs and the fix.
    with psycopg.connect(database_url) as conn:
        off = {name for name in ("autovacuum", "track_counts", "fsync", "full_page_writes")
               if conn.execute(f"SHOW {name}").fetchone()[0] == "off"}
    until(lambda: any(line.get("event") == "projector_started" and line.get("projector") == "gc"
                      for line in json_lines(server.log_path)), "the gc worker's start")
    lines = json_lines(server.log_path)
    for event, settings, fix in (("autovacuum_off", ["autovacuum", "track_counts"], "ALTER SYSTEM SET autovacuum = on"),
                                 ("commits_not_durable", ["fsync", "full_page_writes"], "ALTER SYSTEM SET fsync = on")):
        warned = [line for line in lines if line.get("event") == event]
        named = [name for name in settings if name in off]
        if named:
            assert warned and warned[0]["level"] == "warning" and warned[0]["settings"] == named
            assert fix in warned[0]["fix"] and warned[0]["effect"]
        else:
            assert warned == [], event


def _least_niceness(pid: int) -> int:
    """The niceness of the process's least nice thread: on Linux each thread has its own, and a
    thread started before the process was reniced (numpy's BLAS worker) keeps the one it had."""
    values = []
    for thread in os.listdir(f"/proc/{pid}/task"):
        try:
            values.append(os.getpriority(os.PRIO_PROCESS, int(thread)))  # a thread id: that thread's
        except OSError:  # the thread ended meanwhile
            continue
    if not values:
        raise psutil.NoSuchProcess(pid)
    return min(values)


def _niceness_by_role(server: ServerProcess) -> dict[str, int]:
    """Each child of `contentsvc run` by its role, with the niceness of its least nice thread over
    the supervisor's."""
    base = psutil.Process(server.process.pid).nice()
    roles = {}
    for role, child in server.children().items():
        try:
            roles[role] = _least_niceness(child.pid) - base
        except (psutil.NoSuchProcess, FileNotFoundError):
            continue
    return roles


def _reniced(server: ServerProcess) -> dict[str, int]:
    """The children's niceness once the runner has reniced every projector and worker (once started)."""
    def settled():
        roles = _niceness_by_role(server)
        background = {role: n for role, n in roles.items() if role != "api"}
        return roles if background and 0 not in background.values() else None

    roles = until(settled, "every projector and worker reniced")
    assert {"projector:materializer", "projector:readmodel", "projector:lexical"} <= set(roles)
    return roles


def test_every_fold_and_worker_yields_the_cores_to_the_api(server):
    # Accepting and searching answer first when the cores are short; the folds catch up after
    # ([processes] background_niceness, default 10; projectors/base.py).
    roles = _reniced(server)
    assert roles["api"] == 0
    assert roles["projector:vectors"] == 15  # enrichment yields to indexing too
    assert all(n == 10 for role, n in roles.items() if role not in ("api", "projector:vectors")), roles


def test_the_background_niceness_is_the_operators_to_set(databases, tmp_path):
    server = ServerProcess(databases.create(), tmp_path, extra_env={"CONTENTSVC_BACKGROUND_NICENESS": "3"})
    try:
        roles = _reniced(server)
        assert roles["api"] == 0
        assert roles["projector:vectors"] == 8
        assert all(n == 3 for role, n in roles.items() if role not in ("api", "projector:vectors")), roles
    finally:
        server.stop()


def test_openapi_names_the_contract_operations(server):
    doc = httpx.get(f"{server.base_url}/schema/openapi.json").json()
    operations = {op["operationId"] for path in doc["paths"].values() for op in path.values()}
    assert {"ingestRecord", "ingestBatch", "withdrawRecord", "getRecord", "getVersion", "listRecords", "getReceipt",
            "createCorpus", "listCorpora", "getCorpus", "pollChanges", "streamChanges"} <= operations
    schemas = doc["components"]["schemas"]
    assert {"IngestCommand", "Receipt", "Error", "ChangeEvent"} <= set(schemas)
    assert schemas["Error"]["required"] == ["code", "message", "retryable"]


def test_one_log_line_per_request_without_secrets(server, make_key, org):
    secret = make_key(org)
    with client_for(server, secret) as client:
        corpus = create_corpus(client)
        body = text_command(corpus, "log", "a body that must never be logged")
        r = client.post("/v0/records", json=body)
        request_id = r.headers["x-request-id"]
    deadline = time.time() + 5  # the line is written as the answer leaves: it may land just after
    while not (lines := [line for line in json_lines(server.log_path) if line.get("request_id") == request_id]):
        assert time.time() < deadline, "no log line for the request"
        time.sleep(0.05)
    time.sleep(0.2)  # ... and a second one would follow at once
    lines = [line for line in json_lines(server.log_path) if line.get("request_id") == request_id]
    log_text = server.log_path.read_text()
    assert secret not in log_text and "must never be logged" not in log_text
    assert len(lines) == 1
    line = lines[0]
    assert line["org"] == org and line["route"] == "/v0/records" and line["status"] == 202
    assert isinstance(line["duration_ms"], float)


def test_database_outage_is_503_never_an_empty_answer(databases, tmp_path, admin_url):
    # part1 "A dependency outage is always an error, never an empty success"
    url = databases.create()
    secret = key_for(url, "outage")
    proc = ServerProcess(url, tmp_path)
    try:
        with client_for(proc, secret) as client:
            corpus = create_corpus(client)
            dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
            try:
                for path in (f"/v0/changes?corpus_id={corpus}", f"/v0/records?corpus_id={corpus}", "/v0/corpora"):
                    assert_error(client.get(path), 503, "storage_unavailable")
                assert_error(client.get("/v0/health"), 503, "storage_unavailable")
            finally:
                with psycopg.connect(admin_url, autocommit=True) as admin:
                    admin.execute(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
            # and it recovers on its own
            proc.wait_ready()
            assert client.get(f"/v0/records?corpus_id={corpus}").status_code == 200
    finally:
        proc.stop()
