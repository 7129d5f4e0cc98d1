"""One JSON object per line on stderr, from every logger of every process.

structlog's events and the standard library's records (uvicorn, httpx,
psycopg, asyncio, warnings) end in the same renderer and the same handler,
so a deployment's log can be parsed line by line. Every line carries `process` (which
process of a deployment wrote it: "supervisor", "api", "projector:NAME",
"cli"); an exception is one field, `exception`, never raw lines.

stdout stays free for command output (keys create --json, the MCP server's
protocol frames). Nothing here ever logs a key, a secret or a body, and a
database error's message (which may quote a stored or requested value) is
replaced by its SQLSTATE.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback

import structlog

_process = {"name": "cli"}

# Libraries whose INFO lines say nothing an operator needs, or say too much: httpx logs every
# request's URL (query strings included), pgserver its initdb and pg_ctl chatter.
_QUIET = ("httpx", "httpcore", "uvicorn.access", "hpack", "multipart")


def _add_process(_logger, _method, event_dict):
    event_dict["process"] = _process["name"]
    return event_dict


def _is_database_error(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("psycopg", "psycopg_pool")


def safe_message(exc: BaseException) -> str:
    """The words of an exception that a log line (or a stored fault) may carry. A PostgreSQL
    error's text may quote a value (`Key (name)=(...) already exists`): its type and SQLSTATE
    say what happened without it."""
    if _is_database_error(exc):
        sqlstate = getattr(exc, "sqlstate", None)
        return f"sqlstate {sqlstate}" if sqlstate else "(message withheld)"
    try:
        return str(exc)
    except Exception:  # a broken __str__ must not lose the line
        return "(unprintable)"


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it came from, newest first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain) and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return chain


def describe_exception(exc: BaseException) -> str:
    """The traceback of exc and the exceptions it came from, with database messages withheld."""
    chain = _chain(exc)
    parts: list[str] = []
    for position, item in enumerate(reversed(chain)):
        if position:
            parts.append("\nDuring handling of the above exception, another exception occurred:\n\n")
        if item.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(traceback.format_tb(item.__traceback__))
        name = type(item).__qualname__
        module = type(item).__module__
        parts.append(f"{name if module == 'builtins' else module + '.' + name}: {safe_message(item)}")
    return "".join(parts)


def _render_exception(_logger, _method, event_dict):
    exc_info = event_dict.pop("exc_info", None)
    if exc_info is True:
        exc_info = sys.exc_info()
    if isinstance(exc_info, tuple):
        exc_info = exc_info[1]
    if isinstance(exc_info, BaseException):
        event_dict["exception"] = describe_exception(exc_info)
        event = event_dict.get("event")
        # A library's own message may embed the exception too (asyncio's "Task exception was
        # never retrieved ... exception=UniqueViolation('...')").
        if isinstance(event, str):
            for item in filter(_is_database_error, _chain(exc_info)):
                for text in (repr(item), str(item)):
                    if text:
                        event = event.replace(text, f"{type(item).__name__}({safe_message(item)})")
            event_dict["event"] = event
    event_dict.pop("stack_info", None)
    return event_dict


class _LineHandler(logging.Handler):
    """Writes each formatted record as one line in one write, so that lines of the processes
    sharing a file or pipe never interleave within a line."""

    def __init__(self, stream) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(self.format(record))
        except Exception:
            self.handleError(record)

    def write(self, line: str) -> None:
        self.stream.write(line.replace("\n", "\\n") + "\n")
        self.stream.flush()


class _RenderedLines:
    """structlog's logger: an event structlog rendered is written by the handler, under its lock,
    without first becoming a standard library record (which took two records, a formatter and
    the handler chain: a fifth of the CPU of a request that does little else)."""

    def __init__(self, handler: _LineHandler) -> None:
        self.handler = handler

    def msg(self, line: str) -> None:
        with self.handler.lock:
            self.handler.write(line)

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _log_uncaught(exc_type, exc, tb) -> None:
    log = structlog.get_logger("contentsvc")
    if issubclass(exc_type, KeyboardInterrupt):
        log.info("interrupted")
        return
    log.critical("uncaught_exception", error=exc_type.__name__, exc_info=exc.with_traceback(tb))


def _log_thread_uncaught(args) -> None:
    if args.exc_type is SystemExit:
        return
    structlog.get_logger("contentsvc").critical(
        "uncaught_exception", error=args.exc_type.__name__, thread=getattr(args.thread, "name", None),
        exc_info=args.exc_value)


def _log_unraisable(unraisable) -> None:
    structlog.get_logger("contentsvc").warning(
        "unraisable_exception", error=type(unraisable.exc_value).__name__,
        exc_info=unraisable.exc_value)


def configure(level: str = "info", process: str | None = None) -> None:
    if process:
        _process["name"] = process
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_process,
    ]
    render = [_render_exception, structlog.processors.JSONRenderer()]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *render],
    )
    handler = _LineHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # No line shows a record's caller, thread or process (`process` is ours): leaving them out
    # spares each line a walk of the stack and two getpid calls, a fifth of a request's log line
    # (the "Optimization" table of the logging module's documentation).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    for name in _QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    logging.captureWarnings(True)
    lines = _RenderedLines(handler)
    structlog.configure(
        processors=[*shared, *render],
        wrapper_class=structlog.make_filtering_bound_logger(root.level),
        logger_factory=lambda *_: lines,
        cache_logger_on_first_use=True,
    )
    # A crash is a log line too, not Python's raw traceback on stderr.
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_uncaught
    sys.unraisablehook = _log_unraisable


def get_logger(name: str):
    return structlog.get_logger(name)
