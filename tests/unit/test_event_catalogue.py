"""docs/architecture.md's event catalogue lists exactly the payload Structs of journal/events.py."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from contentsvc.journal import events as ev

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _catalogue_rows() -> list[list[str]]:
    section = ARCHITECTURE.read_text(encoding="utf-8").split("## Event catalogue", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header, _rule, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    assert header == ["kind", "public", "appended by", "payload"]
    return rows


def _members(cell: str) -> list[str]:
    """The leading name of each comma-separated item; commas inside a parenthesized note do not split."""
    items, depth, current = [], 0, ""
    for char in cell:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [re.match(r"\s*([a-z_0-9]+)", item).group(1) for item in items]


def test_the_catalogue_lists_every_kind_once_with_its_public_flag_and_members():
    rows = _catalogue_rows()
    documented = {}
    for kind_cell, public, _appended_by, payload in rows:
        kind = kind_cell.strip("`")
        assert kind not in documented, f"{kind} is listed twice"
        documented[kind] = (public, _members(payload))
    assert sorted(documented) == sorted(ev.PAYLOAD_TYPES)
    for kind, payload_type in ev.PAYLOAD_TYPES.items():
        public, members = documented[kind]
        assert public == ("yes" if payload_type.public else "no"), kind
        assert members == [f.name for f in msgspec.structs.fields(payload_type)], kind


def test_public_kinds_are_the_public_payloads():
    assert ev.PUBLIC_KINDS == {kind for kind, t in ev.PAYLOAD_TYPES.items() if t.public}
    assert ev.PUBLIC_KINDS == {"corpus.created", "corpus.retrieval_changed", "record.accepted",
                               "record.availability_changed", "record.withdrawn", "receipt.resolved",
                               "operation.changed", "match.created", "match.withdrawn", "delivery.changed",
                               "saved_query.updated", "saved_query.deleted",
                               "saved_query.renamed", "subscription.updated", "subscription.deleted",
                               "subscription.renamed", "connector.created", "connector.changed",
                               "connector.run.changed", "connector.push.received", "connector.push.refused"}
