"""The first-party plugins: name, default port and where each is built (decisions-part2,
"Plugin processes and first-party plugins"). `contentsvc plugin list` prints this table and
`contentsvc plugin serve NAME` starts one entry."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from contentsvc_plugins.server import Plugin


@dataclass(frozen=True)
class FirstParty:
    name: str
    port: int
    module: str  # the package under contentsvc_plugins holding the plugin

    @property
    def folder(self) -> Path:
        return Path(__file__).resolve().parent / self.module

    @property
    def available(self) -> bool:
        return (self.folder / "plugin.py").exists()

    def build(self) -> Plugin:
        return importlib.import_module(f"contentsvc_plugins.{self.module}.plugin").build()


FIRST_PARTY = (
    FirstParty("query", 8091, "query"),
    FirstParty("fixture-evaluator", 8092, "fixture_evaluator"),
    FirstParty("rss", 8093, "rss"),
    FirstParty("social_list", 8094, "social_list"),
    FirstParty("pdf", 8095, "pdf"),
)
BY_NAME = {entry.name: entry for entry in FIRST_PARTY}


def first_party(name: str) -> FirstParty | None:
    return BY_NAME.get(name)


def first_party_for_plugin_id(plugin_id: str) -> FirstParty | None:
    """The first-party entry whose plugin id this is (a first-party plugin's id is its name)."""
    return BY_NAME.get(plugin_id)
