"""The `contentsvc` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

# The long-running processes (`python -m contentsvc.cli ...`, as the supervisor starts each one)
# log JSON lines and never render a console traceback; structlog would otherwise import rich for
# that, a tenth of a second of every process's start. Operator commands keep rich for progress.
SERVICE_COMMANDS = (["run"], ["serve"], ["projector", "run"], ["worker", "run"], ["plugin", "serve"])
if __name__ == "__main__" and any(sys.argv[1:1 + len(c)] == c for c in SERVICE_COMMANDS):
    sys.modules.setdefault("rich", None)
    # The API's framework adds its pydantic plugins whenever pydantic imports (it is installed for
    # the MCP server's SDK, which these processes never load). No request or answer here is a
    # pydantic model, and importing them was a sixth of the API process's start (0.15 CPU-s).
    sys.modules.setdefault("pydantic", None)
    # The HTTP client's transport looks for trio whenever it is installed (a test tool brings it);
    # these processes run on asyncio alone, and that import was 60 ms of each one's start.
    sys.modules.setdefault("trio", None)

from contentsvc.bench import SUITES as BENCH_SUITES
from contentsvc.config import ConfigError, Configuration, Settings, install_settings, load_configuration
from contentsvc.config.environment import CONFIG_VARIABLE
from contentsvc.config.loader import DEFAULT_FILE
from contentsvc.logging import configure, get_logger

log = get_logger("contentsvc.cli")


class Stopped(BaseException):
    """SIGTERM or SIGINT: unwinds the command so the embedded server and the home lock are released."""


def port_number(raw: str) -> int:
    """argparse's type of --port: the range `[api] port` allows, refused as a usage error (exit 2)
    rather than a traceback from bind(); 0 is refused too, not taken for 'unset'."""
    try:
        port = int(raw)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 65535, not {raw!r}")
    return port


def _raise_stopped(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def _stop_on_signals() -> None:
    # A long-running command must reach its `finally` on SIGTERM too (Python's default for it is to
    # die on the spot, leaving the embedded PostgreSQL running).
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGINT, _raise_stopped)


def _leave_signals_to_uvicorn() -> None:
    # uvicorn catches SIGTERM/SIGINT while it serves, shuts down gracefully, then raises the signal
    # again; that (or a second signal, sent to the whole process group) must not raise Stopped inside
    # its closing event loop. Returning from its run() is the stop, and the `finally`s still run.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _database_url(settings: Settings, migrate: bool = True, process: str | None = None) -> str:
    """The database's URL, migrated. A long-running `process` started during an outage
    first waits it out (one database_unavailable line) instead of exiting with a traceback."""
    from contentsvc.storage.availability import wait_until_answering
    from contentsvc.storage.database import resolve_database_url
    from contentsvc.storage.migrations import migrate as run_migrations

    url = resolve_database_url(settings)
    if process is not None:
        asyncio.run(wait_until_answering(url, settings.database, process))
    if migrate:
        run_migrations(url)
    return url


def describe_database(settings: Settings) -> str:
    """Which database a command uses, for the operator: the embedded home, or the URL with its
    password (in the authority or a `password` parameter) shown as ***."""
    if not settings.database_url:
        return f"embedded PostgreSQL in {Path(settings.home).expanduser().resolve() / 'pgdata'}"
    import re

    url = settings.database_url
    if "://" in url:
        url = re.sub(r"^([a-z]+://[^:/@?]*:)[^@/?]*@", r"\1***@", url)
        return re.sub(r"([?&]password=)[^&]*", r"\1***", url)
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)  # it parses: the configuration refuses one that does not (config/rules.py)
    if params.get("password"):
        params["password"] = "***"
    return make_conninfo(**params)


@contextlib.contextmanager
def _held_home(settings: Settings):
    """The home, held for this command's lifetime: one `run` or `serve` per home."""
    from contentsvc.processes.home_lock import HomeLock

    with HomeLock(Path(settings.home).expanduser()):
        yield


@contextlib.contextmanager
def _owned_embedded(settings: Settings):
    """The embedded server, when no database URL is set, started here and stopped when the command
    ends (whoever else joined it). Yields its handle, or None."""
    if settings.database_url:
        yield None
        return
    from contentsvc.storage import embedded

    server = embedded.start(Path(settings.home))
    try:
        yield server
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        embedded.stop(server)


def _refuse_busy(exc: Exception, event: str, **fields) -> int:
    from contentsvc.processes.listener import EXIT_BUSY

    log.error(event, message=str(exc), **fields)
    return EXIT_BUSY


def cmd_migrate(args, settings: Settings) -> int:
    from contentsvc.storage.database import resolve_database_url
    from contentsvc.storage.migrations import migrate

    applied = migrate(resolve_database_url(settings))
    print(f"applied {len(applied)} migration(s)" + (": " + ", ".join(applied) if applied else ""))
    return 0


def cmd_serve(args, settings: Settings) -> int:
    # A request's vector math (exact scans of stored vectors) is small: one BLAS thread each lets
    # concurrent searches share the cores instead of oversubscribing them (before numpy loads; an
    # operator's own setting wins).
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
    import uvicorn

    from contentsvc.api.app import create_app
    from contentsvc.processes.home_lock import HomeInUse
    from contentsvc.processes.listener import CannotListen, bind

    host, port = args.host or settings.host, args.port or settings.port
    _stop_on_signals()
    try:
        listener = bind(host, port)
    except CannotListen as exc:
        return _refuse_busy(exc, exc.event, host=host, port=port)
    try:
        # Under `run` the supervisor holds the home and hands a URL down; alone, `serve` holds it.
        with contextlib.ExitStack() as stack:
            if not settings.database_url:
                stack.enter_context(_held_home(settings))
                stack.enter_context(_owned_embedded(settings))
            url = _database_url(settings, migrate=not args.no_migrate, process="api")
            _seed_plugins(url, settings, getattr(args, "pinned_plugins", {}))
            log.info("api_listening", base_url=f"http://{host}:{port}/v0")
            _say_if_the_embedding_model_is_missing(settings)
            config = uvicorn.Config(create_app(settings, url, settings.public_base_url(host, port)),
                                    log_config=None, log_level="warning",
                                    access_log=False, timeout_graceful_shutdown=2,
                                    # The client address is the socket peer: X-Forwarded-For counts only
                                    # from [connectors] trusted_proxies (connectors/push_guards.py), never
                                    # from uvicorn's default of trusting loopback.
                                    proxy_headers=False)
            _leave_signals_to_uvicorn()
            uvicorn.Server(config).run(sockets=[listener])
    except HomeInUse as exc:
        return _refuse_busy(exc, "home_in_use", home=str(exc.home), pid=exc.pid)
    except Stopped:
        pass
    finally:
        listener.close()
    return 0


def _seed_plugins(url: str, settings: Settings, pinned: dict) -> None:
    """The `[plugins.*]` pins as registrations and a configuration plan (once: the registry lock)."""
    from contentsvc.plugins.seeding import seed_at_start

    asyncio.run(seed_at_start(url, settings, pinned))


def _say_if_the_embedding_model_is_missing(settings: Settings) -> None:
    """One line at start naming the fix, rather than a surprise at the first semantic search."""
    from contentsvc.search.embedding import INSTALL_HINT, EmbeddingModelMissing, locate_model

    try:
        locate_model(settings.search.model_dir)
    except EmbeddingModelMissing as exc:
        log.warning("embedding_model_missing", fix=INSTALL_HINT, problem=str(exc),
                    effect="semantic and hybrid search answer 503 search_unavailable and the vectors projector"
                           " waits, until the model is installed and the service restarted; lexical search works")


def cmd_run(args, settings: Settings, config_file: Path | None) -> int:
    from contentsvc.processes.home_lock import HomeInUse
    from contentsvc.processes.listener import CannotListen, check_free
    from contentsvc.processes.supervisor import run_all

    host, port = args.host or settings.host, args.port or settings.port
    _stop_on_signals()
    try:
        with _held_home(settings):
            check_free(host, port)
            with _owned_embedded(settings) as server:
                url = _database_url(settings, process="supervisor")
                _seed_plugins(url, settings, getattr(args, "pinned_plugins", {}))
                return run_all(url, host, port, config_file, embedded_server=server, plugins=settings.plugins)
    except HomeInUse as exc:
        return _refuse_busy(exc, "home_in_use", home=str(exc.home), pid=exc.pid)
    except CannotListen as exc:
        return _refuse_busy(exc, exc.event, host=host, port=port)
    except Stopped:
        return 0


def _kind_named(role: str, name: str):
    """The registry's process kind of that role and name; None (after saying which exist) when unknown."""
    from contentsvc.processes.registry import of_role

    kinds = of_role(role)
    if name not in kinds:
        print(f"unknown {role} {name!r}; known: {', '.join(kinds) or '(none yet)'}", file=sys.stderr)
    return kinds.get(name)


def _run_fold(kind, settings: Settings) -> int:
    import logging

    from contentsvc.projectors.runner import run

    # psycopg notes the transaction a lost connection could not end; the runner's
    # database_unavailable line already says the database went away.
    logging.getLogger("psycopg").setLevel(logging.ERROR)
    projector = kind.build(settings)
    try:
        process = f"{kind.role}:{kind.name}"
        niceness = min(19, settings.processes.background_niceness + projector.niceness_above_background)
        asyncio.run(run(_database_url(settings, process=process), projector, settings=settings.database,
                        process=process, niceness=niceness,
                        ingest_burst_seconds=settings.processes.ingest_burst_seconds))
    except KeyboardInterrupt:
        pass
    return 0


def cmd_projector(args, settings: Settings) -> int:
    from contentsvc.processes.registry import PROJECTOR, of_role

    names = list(of_role(PROJECTOR))
    if args.action == "list":
        for name in names:
            print(name)
        return 0
    if args.action == "status":
        from contentsvc.operator.projectors import print_status

        return print_status(_database_url(settings), names, settings.home, as_json=args.json)
    kind = _kind_named(PROJECTOR, args.name)
    if kind is None:
        return 2
    if args.action == "run":
        return _run_fold(kind, settings)
    if args.action == "replay":
        from contentsvc.operator.projectors import replay

        return replay(_database_url(settings), kind.build(settings), args.corpus, args.org)
    return 2


def cmd_worker(args, settings: Settings) -> int:
    from contentsvc.processes.registry import WORKER, of_role

    if args.action == "list":
        for name in of_role(WORKER):
            print(name)
        return 0
    if args.action == "status":
        from contentsvc.operator.workers import print_worker_status

        return print_worker_status(_database_url(settings), {
            name: kind.fold_class() for name, kind in of_role(WORKER).items()}, as_json=args.json)
    kind = _kind_named(WORKER, args.name)
    return 2 if kind is None else _run_fold(kind, settings)


def cmd_gc(args, settings: Settings) -> int:
    from contentsvc.operator.gc import run_gc

    return run_gc(_database_url(settings), settings, dry_run=args.dry_run)


def cmd_credentials(args, settings: Settings) -> int:
    from contentsvc.operator.credentials import rewrap

    return rewrap(_database_url(settings), settings)


def cmd_keys(args, settings: Settings) -> int:
    from contentsvc.auth import keys
    from contentsvc.storage import embedded
    from contentsvc.storage.database import connect

    if args.action == "create":  # refused before any database is opened or created
        try:
            org = keys.parse_org(args.org)
            actions = keys.parse_actions(args.actions, operator=args.operator)
            corpora = keys.parse_corpora(args.corpora)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    database = describe_database(settings)
    if not settings.database_url and not embedded.exists(Path(settings.home).expanduser()):
        # A key in a database nobody serves is a silent mistake (a command run from the wrong
        # directory): a new embedded database is created only when asked for.
        if not getattr(args, "init", False):
            hint = ("pass --init to create it here, " if args.action == "create" else "") + \
                "set CONTENTSVC_HOME to the home `contentsvc run` uses, or CONTENTSVC_DATABASE_URL"
            print(f"error: there is no database yet: {database} does not exist; {hint}", file=sys.stderr)
            return 2
    print(f"database: {database}", file=sys.stderr)
    url = _database_url(settings)
    with connect(url, autocommit=True) as conn:
        if args.action == "create":
            created = keys.create_key(conn, org, actions, corpora, args.name)
            if args.json:
                print(json.dumps({"key_id": created.key_id, "secret": created.secret, "org": created.org,
                                  "actions": created.actions, "corpora": created.corpora}))
            else:
                print(f"key_id:  {created.key_id}\norg:     {created.org}\nactions: {', '.join(created.actions)}")
                print(f"corpora: {created.corpora if isinstance(created.corpora, str) else ', '.join(created.corpora)}")
                print(f"secret:  {created.secret}\n(the secret is shown once; only its hash is stored)")
            return 0
        if args.action == "list":
            for k in keys.list_keys(conn):
                print(json.dumps(k))
            return 0
        if args.action == "revoke":
            if keys.revoke_key(conn, args.key_id):
                print(f"revoked {args.key_id}")
                return 0
            print(f"no active key {args.key_id}", file=sys.stderr)
            return 1
    return 2


def cmd_bench(args, settings: Settings) -> int:
    from contentsvc.bench import main as bench_main

    return bench_main(args.suite, args.rest)


def cmd_mcp(args, settings: Settings) -> int:
    from contentsvc.mcp.server import main as serve_mcp

    return serve_mcp(args.profile, settings.client)


def cmd_config(args, configuration: Configuration) -> int:
    from contentsvc.config.render import render

    print(render(configuration), end="")
    print(f"\n{_embedding_model_status(configuration.settings)}")
    return 0


def _embedding_model_status(settings: Settings) -> str:
    """A TOML comment saying whether the embedding model is found (semantic search needs it; the
    configuration is valid either way, so this does not change the exit code)."""
    from contentsvc.search.embedding import EmbeddingModelMissing, locate_model
    from contentsvc.search.engine_space import SPACE

    try:
        return f"# embedding model of vector space {SPACE}: found at {locate_model(settings.search.model_dir)}"
    except EmbeddingModelMissing as exc:
        return (f"# embedding model of vector space {SPACE}: NOT FOUND; semantic and hybrid search answer 503"
                f" until it is installed.\n# {exc}")


def cmd_plugin(args, settings: Settings) -> int:
    """decisions-part2, "Operator CLI additions": serve and list first-party plugins, check one."""
    from contentsvc.config.environment import plugin_token
    from contentsvc_plugins.catalog import FIRST_PARTY, first_party

    if args.action == "list":
        for entry in FIRST_PARTY:
            print(f"{entry.name:<18} {entry.port:>5}  {'' if entry.available else '(not built)'}".rstrip())
        return 0
    if args.action == "check":
        from contentsvc.plugins.contract_check import check_command

        return check_command(Path(args.path), args.endpoint, Path(args.settings) if args.settings else None,
                             plugin_token(), as_json=args.json)
    from contentsvc.processes.listener import CannotListen
    from contentsvc_plugins.server import ServeRefused, serve

    entry = first_party(args.name)
    if entry is None or not entry.available:
        known = ", ".join(e.name for e in FIRST_PARTY if e.available)
        print(f"no first-party plugin {args.name!r} (available: {known})", file=sys.stderr)
        return 2
    port = args.port or entry.port
    try:
        serve(entry.build(), args.host, port, plugin_token())
    except ServeRefused as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except CannotListen as exc:
        return _refuse_busy(exc, exc.event, host=args.host, port=port)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="contentsvc", description="A content service on an append-only journal.")
    sub = parser.add_subparsers(dest="command", required=True)
    # decisions-part2, "Startup configuration": --config on every command that reads the configuration.
    configured = argparse.ArgumentParser(add_help=False)
    configured.add_argument("--config", metavar="PATH",
                            help=f"the startup configuration file (else ${CONFIG_VARIABLE}, else ./{DEFAULT_FILE})")

    p = sub.add_parser("run", parents=[configured],
                       help="API plus every projector, supervised (embedded PostgreSQL when no URL is set)")
    p.add_argument("--host")
    p.add_argument("--port", type=port_number)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("serve", parents=[configured], help="the API only")
    p.add_argument("--host")
    p.add_argument("--port", type=port_number)
    p.add_argument("--no-migrate", action="store_true", help="skip applying migrations on start")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("migrate", parents=[configured], help="apply the SQL migrations of schema/")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("projector", help="run, list, inspect or replay projectors")
    psub = p.add_subparsers(dest="action", required=True)
    r = psub.add_parser("run", parents=[configured], help="run one projector until stopped")
    r.add_argument("name")
    psub.add_parser("list", parents=[configured], help="the projectors there are")
    st = psub.add_parser("status", parents=[configured], help="each projector's position and lag, and any fault")
    st.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    r = psub.add_parser("replay", parents=[configured], help="rebuild a projector's output from position 0")
    r.add_argument("name")
    r.add_argument("--corpus", help="rebuild only this Corpus's projection generation (an Operation, with progress)")
    r.add_argument("--org", help="the Corpus's Organization, when its id exists in several")
    p.set_defaults(func=cmd_projector)

    p = sub.add_parser("worker", help="run one worker (the process registry names them)")
    wsub = p.add_subparsers(dest="action", required=True)
    r = wsub.add_parser("run", parents=[configured], help="run one worker until stopped")
    r.add_argument("name")
    wsub.add_parser("list", parents=[configured], help="the workers there are")
    st = wsub.add_parser("status", parents=[configured], help="whether each worker runs, the work waiting for it,"
                                                              " and any fault")
    st.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("gc", parents=[configured],
                       help="delete retired index generations past their grace and Blobs nothing references")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.set_defaults(func=cmd_gc)

    p = sub.add_parser("credentials", help="operator: deposited connector credentials")
    csub = p.add_subparsers(dest="action", required=True)
    csub.add_parser("rewrap", parents=[configured],
                    help="seal every connector credential again under the current credential_key")
    p.set_defaults(func=cmd_credentials)

    p = sub.add_parser("keys", help="operator: API keys")
    ksub = p.add_subparsers(dest="action", required=True)
    c = ksub.add_parser("create", parents=[configured], help="create a key and print its secret once")
    c.add_argument("--org", required=True)
    c.add_argument("--actions", required=True, help="comma-separated actions, or '*'")
    c.add_argument("--corpora", required=True, help="comma-separated corpus ids, or '*'")
    c.add_argument("--name")
    c.add_argument("--operator", action="store_true", help="allow operator actions (plugins:admin)")
    c.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    c.add_argument("--init", action="store_true",
                   help="create the embedded database under CONTENTSVC_HOME if it does not exist yet")
    ksub.add_parser("list", parents=[configured], help="list keys (never their secrets)")
    c = ksub.add_parser("revoke", parents=[configured], help="revoke a key; takes effect on the next request")
    c.add_argument("key_id")
    p.set_defaults(func=cmd_keys)

    p = sub.add_parser("mcp", parents=[configured], help="the agent tool server over stdio")
    p.add_argument("--profile", choices=["read", "ingest"], default="read")
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser("bench", parents=[configured],
                       help="run a benchmark suite (or all of them) and write bench/results/SUITE.json")
    p.add_argument("suite", choices=[*BENCH_SUITES, "all"])
    # argparse counts a REMAINDER positional as required: a bare `contentsvc bench` would name it.
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="SUITE_OPTIONS",
                   help="the suite's own options (contentsvc bench SUITE --help)").required = False
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("config", help="the startup configuration")
    csub = p.add_subparsers(dest="action", required=True)
    csub.add_parser("check", parents=[configured],
                    help="validate it and print the effective configuration (secrets as \"***\")")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("plugin", help="first-party plugin processes and the plugin contract check")
    plsub = p.add_subparsers(dest="action", required=True)
    r = plsub.add_parser("serve", parents=[configured], help="run a first-party plugin (token: $CONTENTSVC_PLUGIN_TOKEN)")
    r.add_argument("name")
    r.add_argument("--host", default="127.0.0.1", help="listen address; a non-loopback one needs the token")
    r.add_argument("--port", type=port_number, help="listen port (default: the plugin's first-party port)")
    plsub.add_parser("list", parents=[configured], help="first-party plugin names and default ports")
    r = plsub.add_parser("check", parents=[configured], help="run the contract check against a running plugin")
    r.add_argument("path", help="the folder holding contentsvc-plugin.json and fixtures/")
    r.add_argument("--endpoint", help="the plugin's base URL (default: its first-party port on 127.0.0.1)")
    r.add_argument("--settings", metavar="FILE.toml", help="installed settings: configuration, routes, kinds, spaces")
    r.add_argument("--json", action="store_true", help="print the check object as JSON")
    p.set_defaults(func=cmd_plugin)
    return parser


def _process_name(args) -> str:
    """The `process` field of every log line: which process of a deployment wrote it."""
    if args.func is cmd_run:
        return "supervisor"
    if args.func is cmd_serve:
        return "api"
    if args.func in (cmd_projector, cmd_worker) and args.action == "run":
        return f"{args.command}:{args.name}"
    if args.func is cmd_mcp:
        return "mcp"
    if args.func is cmd_plugin and args.action == "serve":
        return f"plugin:{args.name}"  # as the supervisor names the child it launches
    return "cli"


def _writes_home(args, settings: Settings) -> bool:
    """Whether the command writes under the home: the service's processes (blobs, indexes, the
    home's lock), and the one-shot commands that would start the embedded server there."""
    if args.func in (cmd_run, cmd_serve, cmd_gc):
        return True
    if args.func in (cmd_projector, cmd_worker):
        return args.action in ("run", "replay")
    return args.func in (cmd_keys, cmd_migrate) and not settings.database_url


def _home_problem(home: Path) -> str | None:
    """Why the home cannot be used, or None: said before anything starts, rather than as a
    traceback from whichever process first writes there. Nothing is left behind: a missing home
    is made by what needs it, so its nearest existing parent must take a new entry. Tried with a
    file that is never linked, since access() says yes to root on a read-only or virtual file system."""
    import tempfile

    existing = home
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{home} is not a directory" if existing == home else \
            f"{home} cannot be created: {existing} is not a directory"
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as exc:
        return f"{home} cannot be {'written' if existing == home else 'created'} ({exc.strerror})"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configuration = load_configuration(getattr(args, "config", None))
    except ConfigError as exc:
        # decisions-part2, "Startup configuration": one line naming the key, exit 2, before listening.
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    if args.func is cmd_config:  # prints the configuration instead of running with it
        return cmd_config(args, configuration)
    settings, file = configuration.settings, configuration.file
    if _writes_home(args, settings) and (problem := _home_problem(Path(settings.home).expanduser())):
        source = " (from CONTENTSVC_HOME)" if ("home",) in configuration.from_environment else ""
        print(f"configuration error: home{source}: {problem}; choose a directory this user can write",
              file=sys.stderr)
        return 2
    args.pinned_plugins = configuration.plugins
    configure(settings.log_level, process=_process_name(args))
    install_settings(settings)
    # Every process of a deployment must read the same file: its sha256 says which one it read.
    log.info("config_loaded", file=str(file.path) if file else None, sha256=file.sha256 if file else None)
    if args.func is cmd_run:  # the supervisor hands the same file to its children
        return cmd_run(args, settings, file.path if file else None)
    try:
        return args.func(args, settings) or 0
    except Exception as exc:
        import psycopg  # every command that reached for the database has imported it already

        from contentsvc.journal.store import UndecodableEvent

        if _process_name(args) == "cli" and isinstance(exc, UndecodableEvent):
            # A replay reaching an event this release cannot read: which one, in one line.
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if _process_name(args) != "cli" or not isinstance(exc, psycopg.OperationalError):
            raise  # the service's processes wait out an outage themselves; anything else is a defect
        # An operator's one-shot command (keys, migrate, gc, ...) whose database does not answer:
        # one line naming the database (its password masked) and PostgreSQL's reason, exit 1.
        reason = " ".join(str(exc).split())
        print(f"error: cannot connect to the database ({describe_database(settings)}): {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
