"""`contentsvc config check`: the effective configuration as TOML, secrets as "***".

The output is itself a valid configuration file (every key with its effective
value), so what an operator reads is what a process runs with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec

from contentsvc.config import schema
from contentsvc.config.loader import Configuration

MASK = "***"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def masked(configuration: Configuration) -> dict[str, Any]:
    """The settings as plain data, every secret replaced by "***"."""
    data = msgspec.to_builtins(configuration.settings, enc_hook=lambda v: str(v) if isinstance(v, Path) else v)
    for pattern, t in schema.leaf_keys():
        if not schema.is_secret(t):
            continue
        for key in schema.concrete_keys(data, pattern):
            table = data
            for part in key[:-1]:
                table = table[part]
            value = table[key[-1]]
            if isinstance(value, dict):
                table[key[-1]] = {k: MASK for k in value}
            elif value is not None:
                table[key[-1]] = MASK
    return data


def render(configuration: Configuration) -> str:
    file = configuration.file
    lines = [f"# configuration file: {file.path}", f"# sha256: {file.sha256}"] if file else [
        "# no configuration file: defaults and environment only"]
    origins = {".".join(key): variable for key, variable in configuration.from_environment.items()}

    def table(data: dict[str, Any], prefix: str) -> None:
        sections = []
        for name, value in data.items():
            dotted = f"{prefix}{name}"
            if schema.is_section(dotted.split(".")):
                sections.append((name, value))
                continue
            note = f"  # from {origins[dotted]}" if dotted in origins else ""
            if value is None:
                lines.append(f"# {_key(name)} is not set{note}")
            else:
                lines.append(f"{_key(name)} = {_value(value)}{note}")
        for name, value in sections:
            lines.extend(["", f"[{prefix}{name}]"])
            table(value, f"{prefix}{name}.")

    table(masked(configuration), "")
    return "\n".join(lines) + "\n"
