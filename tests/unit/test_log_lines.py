"""Every line a process writes on stderr is one JSON object: structlog's events, the standard
library's records (uvicorn, httpx, psycopg, asyncio), warnings and uncaught exceptions alike,
each with the `process` that wrote it; a database error's text (which may quote a value) is
withheld. decisions.md "Logs"."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import asyncio, gc, logging, threading, warnings
import psycopg.errors
from contentsvc.logging import configure, get_logger

configure("info", process="projector:unit")
log = get_logger("contentsvc.test")
log.info("structlog_event", n=1)
logging.getLogger("uvicorn.error").error("uvicorn says\nover two lines")
logging.getLogger("httpx").info("HTTP Request: GET http://h/v0/x?token=quiet-httpx")  # quieted
logging.getLogger("psycopg.pool").warning("pool warning %s", "arg")
warnings.warn("a library warning")
try:
    raise psycopg.errors.UniqueViolation('duplicate key: Key (name)=(value-from-a-request) already exists')
except psycopg.Error as exc:
    log.error("database_error", exc_info=exc)
try:
    {}["missing"]
except KeyError:
    logging.getLogger("asyncio").exception("task failed")
async def failing():
    raise psycopg.errors.UniqueViolation("Key (name)=(value-in-a-task) already exists")
async def leave_a_task_unretrieved():
    task = asyncio.ensure_future(failing())
    await asyncio.sleep(0.01)
    del task
    gc.collect()
asyncio.run(leave_a_task_unretrieved())
thread = threading.Thread(target=lambda: 1 / 0, name="worker")
thread.start(); thread.join()
raise RuntimeError("crash at the top")
'''


def _lines() -> tuple[int, list[dict], str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    return out.returncode, [json.loads(line) for line in out.stderr.splitlines()], out.stderr


def test_every_stderr_line_is_one_json_object_with_its_process():
    code, lines, raw = _lines()
    assert code == 1  # an uncaught exception still ends the process with Python's status
    assert lines and all(isinstance(line, dict) and line["process"] == "projector:unit" for line in lines)
    events = {line["event"] for line in lines}
    assert "structlog_event" in events and "uvicorn says\nover two lines" in events
    assert any(line["event"].startswith("pool warning arg") and line["logger"] == "psycopg.pool" for line in lines)
    assert any("a library warning" in line["event"] and line["logger"] == "py.warnings" for line in lines)
    assert "quiet-httpx" not in raw  # httpx's request lines carry URLs: only its warnings pass
    # Tracebacks are a field, not raw lines: a caught one, a thread's and the uncaught one.
    crashed = [line for line in lines if line["event"] == "uncaught_exception"]
    assert {line.get("thread") for line in crashed} == {"worker", None}
    assert any("RuntimeError: crash at the top" in line["exception"] for line in crashed)
    assert any("ZeroDivisionError" in line["exception"] for line in crashed)
    assert any("KeyError" in line.get("exception", "") for line in lines if line["event"] == "task failed")


def test_a_database_error_is_logged_by_type_and_sqlstate_never_its_text():
    _, lines, raw = _lines()
    logged = [line for line in lines if line["event"] == "database_error"]
    assert len(logged) == 1
    assert "psycopg.errors.UniqueViolation: sqlstate 23505" in logged[0]["exception"]
    assert "value-from-a-request" not in raw
    # asyncio's own message names the exception of a task nobody awaited: withheld there too.
    unretrieved = [line for line in lines if line["event"].startswith("Task exception was never retrieved")]
    assert len(unretrieved) == 1 and "UniqueViolation(sqlstate 23505)" in unretrieved[0]["event"]
    assert "value-in-a-task" not in raw
