"""Every kind of process a deployment runs, in one table.

`contentsvc run` supervises one of each; `contentsvc projector run NAME`
and `contentsvc worker run NAME` start one; `contentsvc projector list` and
`status` report on the projectors; compose.yaml has one service per entry
(tests/unit/test_process_registry.py holds it to this table).

A projector or worker is built from its `factory`, "module:Class" naming a
`contentsvc.projectors.base.Projector`; it is imported only by the process
that runs it, so listing the kinds loads no index library. Adding a worker
is one entry here, `ProcessKind("NAME", WORKER, "contentsvc.SLICE.NAME:Class")`;
a worker that runs a periodic task rather than a fold extends
`contentsvc.projectors.base.PeriodicWorker` (the `gc` worker does).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

API = "api"
PROJECTOR = "projector"
WORKER = "worker"


@dataclass(frozen=True)
class ProcessKind:
    name: str
    role: str  # API, PROJECTOR or WORKER
    factory: str | None = None  # "module:Class" of the fold; None for the API

    @property
    def command(self) -> list[str]:
        """The `contentsvc` arguments that start one (a container's command, a supervised child)."""
        if self.role == API:
            return ["serve", "--no-migrate"]
        return [self.role, "run", self.name]

    def fold_class(self) -> type:
        """The class of the fold this process runs (importing its module)."""
        module, cls = self.factory.split(":")
        return getattr(importlib.import_module(module), cls)

    def build(self, settings):
        """The fold this process runs, built from the settings."""
        return self.fold_class().from_settings(settings)


PROCESSES: tuple[ProcessKind, ...] = (
    ProcessKind("api", API),
    ProcessKind("materializer", PROJECTOR, "contentsvc.projectors.materializer:MaterializerProjector"),
    ProcessKind("readmodel", PROJECTOR, "contentsvc.projectors.readmodel:ReadModelProjector"),
    ProcessKind("lexical", PROJECTOR, "contentsvc.projectors.lexical:LexicalProjector"),
    ProcessKind("vectors", PROJECTOR, "contentsvc.projectors.vectors:VectorProjector"),
    ProcessKind("gc", WORKER, "contentsvc.projectors.gc:GarbageCollector"),
    ProcessKind("plugins", WORKER, "contentsvc.plugins.workers:PluginsWorker"),
    ProcessKind("monitor", WORKER, "contentsvc.monitoring.monitor:MonitorWorker"),
    ProcessKind("deliveries", WORKER, "contentsvc.monitoring.deliverer:DeliveriesWorker"),
    ProcessKind("connectors", WORKER, "contentsvc.connectors.worker:ConnectorsWorker"),
)


def of_role(role: str) -> dict[str, ProcessKind]:
    """The kinds of one role, by name, in registry order."""
    return {kind.name: kind for kind in PROCESSES if kind.role == role}
