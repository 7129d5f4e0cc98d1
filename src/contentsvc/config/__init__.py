"""Configuration: every setting in one typed `Settings`, loaded once at start
(defaults, then the startup file, then the environment), and the contract's
fixed limits.

A process loads its Settings in `cli.main` and passes them down; code deep in
a fold that has no Settings at hand asks `current_settings()`, which answers
what was installed at start. Outside a started process (tests, scripts) it
loads afresh on every call, so it sees the environment as it is then.
"""

from __future__ import annotations

from contentsvc.config.limits import (
    CHANGE_PAGE_DEFAULT,
    CHANGE_PAGE_MAX,
    MAX_BATCH_BYTES,
    MAX_BATCH_ENTRIES,
    MAX_DIAGNOSTICS,
    MAX_INGEST_BYTES,
    MAX_PARTS,
    MAX_RELATIONS,
    MAX_TEXT_BLOB_BYTES,
    RECORD_PAGE_DEFAULT,
    RECORD_PAGE_MAX,
)
from contentsvc.config.loader import ConfigError, ConfigFile, Configuration, load_configuration, load_settings
from contentsvc.config.settings import Settings

_installed: Settings | None = None


def install_settings(settings: Settings) -> None:
    """Called once by a process at start, after loading."""
    global _installed
    _installed = settings


def current_settings() -> Settings:
    return _installed if _installed is not None else load_settings()


__all__ = [
    "CHANGE_PAGE_DEFAULT", "CHANGE_PAGE_MAX", "MAX_BATCH_BYTES", "MAX_BATCH_ENTRIES", "MAX_DIAGNOSTICS",
    "MAX_INGEST_BYTES", "MAX_PARTS", "MAX_RELATIONS", "MAX_TEXT_BLOB_BYTES", "RECORD_PAGE_DEFAULT",
    "RECORD_PAGE_MAX", "ConfigError", "ConfigFile", "Configuration", "Settings", "current_settings",
    "install_settings", "load_configuration", "load_settings",
]
