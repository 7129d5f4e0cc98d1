"""The import layers of docs/architecture.md ("Layers"), checked over the real import graph.

Every module of the installed `contentsvc` namespace (including `contentsvc.projectors`
and `contentsvc.bench`, which live in top-level folders of the checkout) is parsed, and
each import of another contentsvc package must point to a lower layer: api -> commands ->
domain -> journal; projectors and workers -> the read side, domain and journal. Imports
inside functions count too (a lazy import is still a dependency). The domain does no I/O.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

# Top to bottom. A package may import packages of lower layers, and its own package;
# never a package of its own layer or above it.
LAYERS: list[set[str]] = [
    {"cli"},
    {"bench"},
    {"processes", "operator", "mcp"},
    {"api"},
    {"commands", "projectors"},
    {"search"},
    {"readmodel"},
    {"auth"},
    {"domain"},
    {"journal"},
    {"slice_events"},
    {"storage"},
    {"config", "logging", "ids", "overlap", "outbound_http", "libc"},
    {"manifest"},
]
LAYER_OF = {package: depth for depth, packages in enumerate(LAYERS) for package in packages}

# Part 2's vertical slices each hold their routes, commands, events, views and workers
# (design.md): each part of a slice sits in the layer of its kind.
SLICES = {"plugins", "monitoring", "connectors"}
SLICE_PARTS = {"routes": "api", "commands": "commands", "workers": "projectors", "views": "readmodel",
               "events": "slice_events",
               # The plugins slice's registry writers and reads (shared by its commands and its worker,
               # which sit in one layer) and its plan cache are on the read side; its request and
               # answer shapes are pure, with the domain; seeding is a command. The plan rules are
               # pure and import nothing: the startup configuration checks its pins with them, so
               # they sit with the manifest, below config.
               "registry": "readmodel", "plans": "readmodel", "shapes": "domain", "planning": "manifest",
               "store": "storage", "seeding": "commands",
               # The plugins slice's foundation: the contract check (run by the plugins worker and the
               # CLI), the one HTTP client to plugins (an outbound adapter, like storage), and the
               # manifest, which the startup configuration validates, so it sits below config.
               "contract_check": "search", "client": "storage", "manifest": "manifest",
               # The monitoring slice's deliveries: the worker, the tables' one writer (read side),
               # the pure webhook bytes and signing, the delivery.changed payload, the read routes.
               "deliverer": "projectors", "deliveries": "readmodel", "webhooks": "domain",
               "delivery_events": "slice_events", "delivery_routes": "api",
               # Which evaluator serves new Subscriptions (a registry read), the pure subscription
               # request builder the preview and the monitor worker share, the preview and
               # evaluator migration routes.
               "evaluators": "readmodel", "evaluation_request": "domain", "previews": "api", "migration": "api",
               # Its evaluator: the worker, the Matches' one writer (above the read side: it commits
               # each Match with its Delivery through the Delivery writer), the pure batching and
               # answer checks, the match.* payloads, the Match routes.
               "monitor": "projectors", "matches": "search", "batches": "domain",
               "match_events": "slice_events", "match_routes": "api",
               # The connectors slice: the catalog of served kinds (above the plugins slice's plan reads),
               # the credential sealing (key reads), the pure health rules and page checks; its worker
               # accepts each page's items through the ingest command path, so it sits above the commands.
               "kinds": "search", "credentials": "readmodel", "health": "domain", "pages": "domain",
               "worker": "processes", "instance_tokens": "commands", "push_guards": "domain",
               "push_store": "readmodel", "push_ingests": "commands", "push_routes": "api",
               # the worker's attachment uploads run the upload commands: above them, beside the routes
               "attachments": "api"}

# The domain computes; it never reaches a database, a network, an index or a server.
DOMAIN_FORBIDDEN = ("psycopg", "psycopg_pool", "httpx", "tantivy", "hnswlib", "litestar", "uvicorn", "os",
                    "contentsvc.storage")


def _package_roots() -> dict[str, Path]:
    """contentsvc's first-level packages and modules, wherever the install put them."""
    roots: dict[str, Path] = {}
    base = Path(importlib.import_module("contentsvc").__file__).parent
    for path in base.iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            roots[path.name] = path
        elif path.suffix == ".py" and path.stem != "__init__":
            roots[path.stem] = path
    for mapped in ("projectors", "bench"):  # installed from the checkout's top-level folders
        roots[mapped] = Path(importlib.import_module(f"contentsvc.{mapped}").__file__).parent
    return roots


def _modules(root: Path) -> list[Path]:
    return [root] if root.is_file() else sorted(root.rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module == "contentsvc":  # `from contentsvc import x` names package x
                found.extend((node.lineno, f"contentsvc.{alias.name}") for alias in node.names)
    return found


def _dotted(package: str, root: Path, path: Path) -> str:
    if root.is_file():
        return f"contentsvc.{package}"
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return "contentsvc." + ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> tuple[str, ...] | None:
    """What a layer is decided by: the first-level package, or a slice and its part."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    if parts[0] in SLICES:
        return tuple(parts[:2]) if len(parts) > 1 else None  # a slice's own __init__ imports nothing
    return (parts[0],)


def _layer(unit: tuple[str, ...]) -> int | None:
    if unit[0] in SLICES:
        return LAYER_OF.get(SLICE_PARTS.get(unit[1], ""))
    return LAYER_OF.get(unit[0])


def _edges() -> list[tuple[str, Path, int, str]]:
    """(importing module, file, line, imported module) for every import in the namespace."""
    return [(_dotted(package, root, path), path, line, module)
            for package, root in _package_roots().items()
            for path in _modules(root)
            for line, module in _imports(path)]


def _extends_its_layer(here: tuple[str, ...], there: tuple[str, ...]) -> bool:
    """A slice's part builds on the shared package of its layer (its routes on api's route
    declarations, its commands on the idempotency claims, its domain shapes on the Error envelope),
    and that package gathers the slices' parts (the app lists every route): both directions are
    allowed between a slice part and its layer's first-level package, never between two slices."""
    return (here[0] in SLICES) != (there[0] in SLICES)


def test_every_module_has_a_layer():
    unplaced = sorted({source for source, *_ in _edges()
                       if _unit(source) is not None and _layer(_unit(source)) is None})
    assert not unplaced, f"modules without a layer in LAYERS (and docs/architecture.md): {unplaced}"


def test_imports_point_down_the_layers():
    violations = []
    for source, path, line, module in _edges():
        if not module.startswith("contentsvc."):
            continue
        here, there = _unit(source), _unit(module)
        if here is None or there is None or here == there:
            continue
        if _layer(here) is not None and _layer(there) is not None and _layer(there) <= _layer(here):
            if _layer(there) == _layer(here) and _extends_its_layer(here, there):
                continue
            violations.append(f"{path}:{line}: {source} imports {module}")
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


@pytest.mark.parametrize("forbidden", DOMAIN_FORBIDDEN)
def test_the_domain_does_no_io(forbidden):
    offending = [f"{path}:{line}: {module}" for source, path, line, module in _edges()
                 if source.startswith("contentsvc.domain") and (module == forbidden or module.startswith(forbidden + "."))]
    assert not offending, "\n".join(offending)
