"""`contentsvc plugin check` as an operator runs it, a real process against a real plugin process,
for the first-party plugin tests."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.integration.plugin_processes import CONTENTSVC


def plugin_check(folder: Path, endpoint: str, *extra: str) -> tuple[int, dict]:
    """Exit code and the JSON report of `contentsvc plugin check FOLDER --endpoint URL --json`."""
    env = {k: v for k, v in os.environ.items() if k not in ("CONTENTSVC_PLUGIN_TOKEN", "CONTENTSVC_CONFIG")}
    done = subprocess.run([*CONTENTSVC, "plugin", "check", str(folder), "--endpoint", endpoint, "--json", *extra],
                          capture_output=True, text=True, timeout=120, env=env, cwd=folder.parent, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])  # logs may precede the report


def failures(report: dict) -> list[dict]:
    return [check for check in report["checks"] if check["status"] != "pass"]
