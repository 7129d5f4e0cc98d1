"""A plugin's fixture files: every `.json` file under its fixtures folder, told apart by their
top-level members (decisions-part2, "Contract check")."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec


class Fixture(msgspec.Struct, frozen=True):
    path: str  # relative to the fixtures folder, with "/" separators
    location: Path
    raw: bytes
    document: object
    kind: str | None  # normalizer, subscription, connector; None when not recognised


def load_fixtures(folder: Path) -> list[Fixture]:
    """Every `.json` file under the folder, in path order (decisions-part2: fixture files anywhere under it)."""
    if not folder.is_dir():
        return []
    fixtures = []
    for location in sorted(folder.rglob("*.json")):
        if not location.is_file():
            continue
        raw = location.read_bytes()
        try:
            document = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            document = None
        fixtures.append(Fixture(path=location.relative_to(folder).as_posix(), location=location, raw=raw,
                                document=document, kind=_fixture_kind(document)))
    return fixtures


def _fixture_kind(document: object) -> str | None:
    if not isinstance(document, dict):
        return None
    if "evaluations" in document:  # part 2: subscription fixtures are told apart by top-level evaluations
        return "subscription"
    if "connector" in document:
        return "connector"
    if "input" in document:
        return "normalizer"
    return None
