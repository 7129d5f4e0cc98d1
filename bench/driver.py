"""What every suite does around its measurements: the run's machine and clock, targets
judged the same way, the results file, and the closing lines of the summary."""

from __future__ import annotations

import json
import logging
import operator
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import httpx
import psycopg

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The shared data sets sit beside the checkout (../shared/datasets).
DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"

COMPARE = {">=": operator.ge, "<=": operator.le, "<": operator.lt}


class BenchError(RuntimeError):
    """A run that cannot go on; the suite prints it and exits 1."""


def teller(bench: str) -> Callable[[str], None]:
    """The suite's progress printer: each message a line of its own on stderr, as `[bench NAME] message`."""
    def say(message: str) -> None:
        print(f"[bench {bench}] {message}", file=sys.stderr, flush=True)
    return say


class Progress:
    """One line of progress on stderr: rewritten in place on a terminal; elsewhere (a log file,
    CI) a line of its own at most every `every_s` seconds, so that the log reads as lines."""

    def __init__(self, bench: str, every_s: float = 10.0) -> None:
        self.prefix = f"[bench {bench}] "
        self.terminal = sys.stderr.isatty()
        self.every_s = every_s
        self._last: float | None = None

    def show(self, text: str) -> None:
        now, text = time.monotonic(), self.prefix + text
        if self.terminal:
            print(f"\r{text}", end="", file=sys.stderr, flush=True)
        elif self._last is None or now - self._last >= self.every_s:
            print(text, file=sys.stderr, flush=True)
        else:
            return
        self._last = now

    def done(self) -> None:
        """Ends the line rewritten in place, if one was shown."""
        if self.terminal and self._last is not None:
            print(file=sys.stderr, flush=True)


def quiet_http_logs() -> None:
    # The CLI logs at info; one line per request would drown the summary.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str | None:
    """The processor's name (/proc/cpuinfo on Linux): figures of two runs compare only on the same one."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or None


def cpu_probe_ms(runs: int = 3) -> list[float]:
    """Milliseconds one core takes for the same pure-Python loop, a few times over. loadavg only
    sees this machine's own processes; a shared host's other tenants or a throttled clock show
    here instead: on a steady machine the runs, and the probes before and after a suite, agree
    within a few percent (on one machine here ten times this loop took from 1.03 to 1.47 s within
    a minute, and a suite's figures moved with it)."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        times.append(round((time.perf_counter() - started) * 1000, 1))
    return times


def machine_info() -> dict[str, Any]:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "nproc": affinity or os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "httpx": httpx.__version__,
        "psycopg": psycopg.__version__,
        "loadavg_start": None,
        "loadavg_end": None,
        "cpu_probe_ms_start": None,
        "cpu_probe_ms_end": None,
    }


class Run:
    """One run of a suite: when it started, how long it took, and the machine it ran on with its
    load and the speed of one of its cores before and after (a noisy machine explains a slow figure)."""

    def __init__(self) -> None:
        quiet_http_logs()
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)  # the service's log goes there from the start
        self.started = datetime.now(timezone.utc)
        self._t0 = time.perf_counter()
        self.machine = machine_info()
        self.machine["loadavg_start"] = loadavg()
        self.machine["cpu_probe_ms_start"] = cpu_probe_ms()

    @property
    def timestamp(self) -> str:
        return self.started.isoformat(timespec="seconds").replace("+00:00", "Z")

    def finish(self) -> None:
        self.machine["loadavg_end"] = loadavg()
        self.machine["cpu_probe_ms_end"] = cpu_probe_ms()

    def duration_s(self) -> float:
        return round(time.perf_counter() - self._t0, 1)

    def head(self, suite: str) -> dict[str, Any]:
        """The first keys of a results file."""
        return {"suite": suite, "timestamp": self.timestamp, "duration_s": self.duration_s()}


def meets(value: float, op: str, goal: float) -> bool:
    return COMPARE[op](value, goal)


def judge(targets: dict[str, dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
    """Each target ({"op", "value", "unit"}) with its measured figure and "pass", "miss", or
    "n/a" when the run produced no figure."""
    out = {}
    for name, t in targets.items():
        v = measured[name]
        verdict = "n/a" if v is None else "pass" if meets(v, t["op"], t["value"]) else "miss"
        out[name] = {**t, "measured": v, "result": verdict}
    return out


def write_results(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        v = f"{v:,.1f}"
    elif isinstance(v, int):
        v = f"{v:,}"
    return f"{v}{unit}"


def machine_line(machine: dict[str, Any]) -> str:
    model = f", {machine['cpu_model']}" if machine.get("cpu_model") else ""
    probes = [machine.get(f"cpu_probe_ms_{at}") for at in ("start", "end")]
    probe = ", core probe " + " -> ".join(f"{min(p):g}-{max(p):g}" for p in probes) + " ms" if all(probes) else ""
    return (f"({machine['nproc']} cpu{model}, python {machine['python']}, loadavg {machine['loadavg_start']} -> "
            f"{machine['loadavg_end']}{probe})")


def target_lines(report: dict[str, Any]) -> list[str]:
    """One line per target: what it asks, what was measured, PASS or MISS."""
    def figure(v: Any) -> str:
        if isinstance(v, float):  # small figures (ratios, cosines) keep four significant digits
            return f"{v:,.2f}" if abs(v) >= 10 else f"{v:.4g}"
        return fmt(v)
    return [f"target {name:<22} {t['op']} {figure(t['value']):>10} {t['unit']:<8} measured {figure(t['measured']):>10}"
            f"  {t['result'].upper()}" for name, t in report["targets"].items()]


def closing_lines(report: dict[str, Any], result_path: Path) -> list[str]:
    """The server log's health and where the figures went (the last lines of every summary)."""
    lines = []
    log = report.get("server_log")
    if log:
        lines.append(f"server log {log['path']}: {log['lines']} lines, levels {log.get('by_level', {})}, "
                     f"tracebacks {log.get('tracebacks', 0)}")
    return lines + [f"written {result_path}"]
