"""The process environment: the one module of the code base that reads it.

Environment variables override keys of the file (env wins, decisions-part2:
"Startup configuration"). Each variable names one key; its parser turns the
text into that key's type where it can and otherwise hands the text on, so
the key's own validation explains what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

CONFIG_VARIABLE = "CONTENTSVC_CONFIG"

KeyPath = tuple[str, ...]


def _text(raw: str) -> object:
    return raw


def _integer(raw: str) -> object:
    try:
        return int(raw)
    except ValueError:
        return raw


def _number(raw: str) -> object:
    try:
        return float(raw)
    except ValueError:
        return raw


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(raw: str) -> object:
    """Seconds, or a number with a unit suffix: 30s, 15m, 12h, 7d (1.5h too)."""
    try:
        if raw[-1] in _UNITS:
            return int(float(raw[:-1]) * _UNITS[raw[-1]])
        return int(raw)
    except ValueError:
        return raw


_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _flag(raw: str) -> object:
    return _FLAGS.get(raw.lower(), raw)


def _lowercase(raw: str) -> object:
    return raw.lower()


def _comma_list(raw: str) -> object:
    return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class EnvOverride:
    variable: str
    key: KeyPath
    parse: Callable[[str], object]


# Part 1's variables keep their meaning; part 2's are the ones decisions-part2 lists.
OVERRIDES = (
    EnvOverride("CONTENTSVC_DATABASE_URL", ("database_url",), _text),
    EnvOverride("CONTENTSVC_HOME", ("home",), _text),
    EnvOverride("CONTENTSVC_LOG_LEVEL", ("log_level",), _lowercase),
    EnvOverride("CONTENTSVC_HOST", ("api", "host"), _text),
    EnvOverride("CONTENTSVC_PORT", ("api", "port"), _integer),
    EnvOverride("CONTENTSVC_CHANGE_RETENTION", ("changes", "retention_seconds"), _duration),
    EnvOverride("CONTENTSVC_STREAM_CHECKPOINT_SECONDS", ("changes", "stream_checkpoint_seconds"), _integer),
    EnvOverride("CONTENTSVC_MAX_BLOB_BYTES", ("uploads", "max_blob_bytes"), _integer),
    EnvOverride("CONTENTSVC_UPLOAD_URL_TTL", ("uploads", "url_ttl_seconds"), _duration),
    EnvOverride("CONTENTSVC_ENGINE_VECTORS", ("search", "engine_vectors"), _flag),
    EnvOverride("CONTENTSVC_EMBEDDING_MODEL_DIR", ("search", "model_dir"), _text),
    EnvOverride("CONTENTSVC_RETIRED_GRACE_SECONDS", ("search", "retired_grace_seconds"), _duration),
    EnvOverride("CONTENTSVC_BACKFILL_CHUNK", ("search", "backfill_chunk"), _integer),
    EnvOverride("CONTENTSVC_GC_RETIRED_GENERATION_GRACE", ("gc", "retired_generation_grace_seconds"), _duration),
    EnvOverride("CONTENTSVC_GC_INTERVAL", ("gc", "interval_seconds"), _duration),
    EnvOverride("CONTENTSVC_BACKGROUND_NICENESS", ("processes", "background_niceness"), _integer),
    EnvOverride("CONTENTSVC_INGEST_BURST_SECONDS", ("processes", "ingest_burst_seconds"), _duration),
    EnvOverride("CONTENTSVC_MAX_INGEST_BACKLOG", ("ingest", "max_backlog_seconds"), _duration),
    EnvOverride("CONTENTSVC_URL", ("client", "url"), _text),
    EnvOverride("CONTENTSVC_API_KEY", ("client", "api_key"), _text),
    EnvOverride("CONTENTSVC_TEST_DATABASE_URL", ("bench", "admin_database_url"), _text),
    EnvOverride("CONTENTSVC_PLUGIN_PLAN_POLL", ("plugin_plan_poll",), _number),
    EnvOverride("CONTENTSVC_CREDENTIAL_KEY", ("connectors", "credential_key"), _text),
    EnvOverride("CONTENTSVC_CREDENTIAL_KEY_ID", ("connectors", "credential_key_id"), _text),
    EnvOverride("CONTENTSVC_PUBLIC_BASE_URL", ("connectors", "public_base_url"), _text),
    EnvOverride("CONTENTSVC_TRUSTED_PROXIES", ("connectors", "trusted_proxies"), _comma_list),
    EnvOverride("CONTENTSVC_FIXTURE_CONNECTOR", ("connectors", "fixture_enabled"), _flag),
)


def process_environment() -> Mapping[str, str]:
    return os.environ


def overrides(environ: Mapping[str, str]) -> list[tuple[EnvOverride, object]]:
    """The overrides set in environ, parsed; an empty variable counts as unset."""
    found = []
    for override in OVERRIDES:
        raw = environ.get(override.variable, "").strip()
        if raw:
            found.append((override, override.parse(raw)))
    return found


PLUGIN_TOKEN_VARIABLE = "CONTENTSVC_PLUGIN_TOKEN"


def plugin_token(environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token a plugin process requires, and `contentsvc plugin check` presents
    (decisions-part2, "How the service calls plugins"); None when unset or empty."""
    value = (os.environ if environ is None else environ).get(PLUGIN_TOKEN_VARIABLE, "")
    return value or None


def child_environment(**variables: str) -> dict[str, str]:
    """This process's environment plus `variables`: what a child process is started with."""
    return {**os.environ, **variables}
