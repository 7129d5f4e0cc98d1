"""Latency figures and error tallies, the same in every suite."""

from __future__ import annotations

import resource
from collections import Counter
from typing import Any

import psutil


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def latency_summary(values_ms: list[float]) -> dict[str, Any]:
    r = lambda v: None if v is None else round(v, 2)  # noqa: E731
    return {
        "count": len(values_ms),
        "p50_ms": r(percentile(values_ms, 50)),
        "p95_ms": r(percentile(values_ms, 95)),
        "p99_ms": r(percentile(values_ms, 99)),
        "max_ms": r(max(values_ms) if values_ms else None),
        "mean_ms": r(sum(values_ms) / len(values_ms) if values_ms else None),
    }


class Errors:
    """Non-success answers by kind, with a few samples."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.samples: list[str] = []

    def add(self, kind: str, detail: str = "") -> None:
        self.counts[kind] += 1
        if len(self.samples) < 5:
            self.samples.append(f"{kind}: {detail[:300]}")

    def total(self) -> int:
        return sum(self.counts.values())

    def report(self) -> dict[str, Any]:
        return {"total": self.total(), "by_kind": dict(self.counts), "samples": self.samples}


def median_low_index(values: list[float]) -> int:
    """The position of the median value (the lower middle one for an even count), so that the
    figures reported beside a median are a real run's."""
    return sorted(range(len(values)), key=values.__getitem__)[(len(values) - 1) // 2]


def cpu_seconds() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def machine_busy_seconds() -> float:
    """CPU seconds all cores together have spent working since boot (user, nice, system, irq and
    softirq: not idle, waiting on I/O or stolen by the host). The difference around a phase is
    what the whole machine spent on it: client, server and the kernel's threads together."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq
