"""Loading the configuration once at start: defaults, then the startup file, then
environment overrides (decisions-part2, "Startup configuration").

Anything wrong stops the process with one `ConfigError` naming the key path
(`connectors.interval_floor_seconds`) and the problem.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from contentsvc.config import environment, rules, schema
from contentsvc.config.plugins import PinnedPlugin, destination_problems, load_plugins
from contentsvc.config.schema import KeyPath
from contentsvc.config.settings import Settings

DEFAULT_FILE = "contentsvc.toml"
SECRET_FROM_ENV = "env:"


class ConfigError(Exception):
    """Invalid configuration: `where` is a key path (or the file), `problem` says what is wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


@dataclass(frozen=True)
class ConfigFile:
    path: Path
    sha256: str


@dataclass(frozen=True)
class Configuration:
    """The effective settings and where they came from."""

    settings: Settings
    file: ConfigFile | None = None
    # Keys the environment set, with the variable that set each.
    from_environment: dict[KeyPath, str] = field(default_factory=dict)
    # The [plugins.*] entries with their manifests read and pinned at load.
    plugins: dict[str, PinnedPlugin] = field(default_factory=dict)


def load_settings(config_path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    return load_configuration(config_path, environ).settings


def load_configuration(config_path: str | Path | None = None,
                       environ: Mapping[str, str] | None = None) -> Configuration:
    """`config_path` is `--config`; without it CONTENTSVC_CONFIG, else ./contentsvc.toml when it exists."""
    environ = environment.process_environment() if environ is None else environ
    path = _locate(config_path, environ)
    raw: dict[str, Any] = {}
    file = None
    if path is not None:
        raw, file = _read(path)
        _resolve_paths(raw, path.parent)
    from_environment = _apply_overrides(raw, environ)
    _resolve_secrets(raw, environ, from_environment)
    settings = _convert(raw, from_environment)
    for where, problem in rules.problems(settings):
        raise ConfigError(_label(where, from_environment), problem)
    for where, problem in destination_problems(settings):
        raise ConfigError(where, problem)
    pinned, problems = load_plugins(settings)
    for where, problem in problems:
        raise ConfigError(where, problem)
    return Configuration(settings, file, from_environment, pinned)


def _locate(config_path: str | Path | None, environ: Mapping[str, str]) -> Path | None:
    named = config_path or environ.get(environment.CONFIG_VARIABLE, "").strip()
    if named:
        path = Path(named).expanduser().resolve()
        if not path.is_file():  # an explicitly named file must exist
            origin = "--config" if config_path else environment.CONFIG_VARIABLE
            raise ConfigError(str(path), f"no such configuration file (named by {origin})")
        return path
    default = Path(DEFAULT_FILE)
    return default.resolve() if default.is_file() else None


def _read(path: Path) -> tuple[dict[str, Any], ConfigFile]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the configuration file: {exc.strerror}") from None
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"invalid TOML: {exc}") from None
    return raw, ConfigFile(path, hashlib.sha256(data).hexdigest())


def _table(raw: dict[str, Any], key: KeyPath, create: bool) -> dict[str, Any] | None:
    """The table holding `key`'s last part; None when a non-table stands in the way."""
    table = raw
    for part in key[:-1]:
        if part not in table and create:
            table[part] = {}
        table = table.get(part)
        if not isinstance(table, dict):
            return None
    return table


def _absolute(value: str, base: Path) -> str:
    return str((base / Path(value).expanduser()).resolve())


def _resolve_paths(raw: dict[str, Any], base: Path) -> None:
    """Relative paths written in the file resolve against the file's folder."""
    for pattern, t in schema.leaf_keys():
        if not schema.is_path(t):
            continue
        for key in schema.concrete_keys(raw, pattern):
            table = _table(raw, key, create=False)
            value = table.get(key[-1]) if table is not None else None
            if isinstance(value, str) and value:
                table[key[-1]] = _absolute(value, base)


def _apply_overrides(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[KeyPath, str]:
    """The environment wins over the file; its relative paths resolve against the working directory."""
    types = dict(schema.leaf_keys())
    applied = {}
    for override, value in environment.overrides(environ):
        table = _table(raw, override.key, create=True)
        if table is None:  # a non-table stands where the section belongs: its own error is reported
            continue
        if schema.is_path(types[override.key]) and isinstance(value, str):
            value = _absolute(value, Path.cwd())
        table[override.key[-1]] = value
        applied[override.key] = override.variable
    return applied


def _resolve_secrets(raw: dict[str, Any], environ: Mapping[str, str], from_environment: dict[KeyPath, str]) -> None:
    """A secret is a literal or `env:NAME`, read now; an unset NAME stops the start."""

    def resolve(where: str, value: Any) -> Any:
        if not isinstance(value, str):
            raise ConfigError(_label(where, from_environment), "must be a string")
        if not value.startswith(SECRET_FROM_ENV):
            return value
        name = value[len(SECRET_FROM_ENV):]
        resolved = environ.get(name, "")
        if not resolved:
            raise ConfigError(_label(where, from_environment),
                              f"names the environment variable {name}, which is not set")
        return resolved

    for pattern, t in schema.leaf_keys():
        if not schema.is_secret(t):
            continue
        for key in schema.concrete_keys(raw, pattern):
            table = _table(raw, key, create=False)
            value = table.get(key[-1]) if table is not None else None
            where = ".".join(key)
            if value is None:
                continue
            if schema.is_table(t):  # a table of secrets; anything else there is the type check's to report
                if isinstance(value, dict):
                    table[key[-1]] = {k: resolve(f"{where}.{k}", v) for k, v in value.items()}
            else:
                table[key[-1]] = resolve(where, value)


def _decode_path(t: type, value: Any) -> Any:
    if t is Path and isinstance(value, str):
        return Path(value)
    raise TypeError(f"expected {t.__name__}")


_LOCATION = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<location>.*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([^.\[]+)|(\[[^\]]*\])")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>.*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<name>.*)`$")
_ENTRY_ID = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")  # plugin and destination ids (decisions-part2)


def _convert(raw: dict[str, Any], from_environment: dict[KeyPath, str]) -> Settings:
    _convert_entries(raw, from_environment)
    try:
        return msgspec.convert(raw, Settings, dec_hook=_decode_path)
    except msgspec.ValidationError as exc:
        _refuse(exc, [], [], from_environment)


def _convert_entries(raw: dict[str, Any], from_environment: dict[KeyPath, str]) -> None:
    """Each entry of a table keyed by id ([plugins.rss]) on its own first: msgspec's own location
    would say `plugins[...]`, and the error must name the id."""
    for field_info in schema.settings_type().fields:
        entry = schema.entry_type(field_info.type)
        tables = raw.get(field_info.name)
        if entry is None or not isinstance(tables, dict):
            continue
        for name, table in tables.items():
            if not _ENTRY_ID.match(name):
                raise ConfigError(f"{field_info.name}.{name}", f"the id must match {_ENTRY_ID.pattern}")
            try:
                msgspec.convert(table, entry.cls, dec_hook=_decode_path)
            except msgspec.ValidationError as exc:
                _refuse(exc, [field_info.name, name], [field_info.name, "[...]"], from_environment)


def _refuse(exc: msgspec.ValidationError, named: list[str], typed: list[str],
            from_environment: dict[KeyPath, str]):
    """A ConfigError from msgspec's refusal; `named` and `typed` prefix its location for the message
    and for looking up the key's type."""
    match = _LOCATION.match(str(exc))
    steps = [name or index for name, index in _STEP.findall(match["location"] or "")]
    unknown = _UNKNOWN.match(match["message"])
    if unknown:
        raise ConfigError(_dotted([*named, *steps, unknown["name"]]), "unknown key") from None
    missing = _MISSING.match(match["message"])
    if missing:
        raise ConfigError(_dotted([*named, *steps, missing["name"]]), "is required") from None
    t = schema.type_at([*typed, *steps])
    problem = f"must be {schema.describe(t)}" if t is not None else match["message"]
    raise ConfigError(_label(_dotted([*named, *steps]), from_environment), problem) from None


def _dotted(steps: list[str]) -> str:
    return "".join(step if step.startswith("[") else f".{step}" for step in steps).lstrip(".")


def _label(where: str, from_environment: dict[KeyPath, str]) -> str:
    """The key path, with the variable that set it when the value came from the environment."""
    for key, variable in from_environment.items():
        dotted = ".".join(key)
        if where == dotted or where.startswith((dotted + ".", dotted + "[")):
            return f"{where} (from {variable})"
    return where
