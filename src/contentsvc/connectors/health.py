"""Connector Health (part 2 "Connector", "Connector health and push"; decisions-part2 "Runs"):
a pure function of what the Connector row holds and the clock. States in precedence order:
`disabled`, `access_error` (the last run failed with class `access`, or the push channel failed
with class `access`), `credential_expiring` (the credential's expiry within
`credential_warning_seconds`), `silent` (no new item for `silent_after_seconds` since the last
item, else since creation), `active`. Other failures show only as `last_error`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from contentsvc.domain.clock import iso

STATES = ("disabled", "access_error", "credential_expiring", "silent", "active")


@dataclass(frozen=True)
class Facts:
    enabled: bool
    created_at: datetime
    last_item_at: datetime | None
    last_success_at: datetime | None
    last_error: dict[str, Any] | None  # {code, at, error_class?} of the last failed run, None after a success
    credential_expires_at: datetime | None
    silent_after_seconds: int
    credential_warning_seconds: int
    usage_day: date | None
    items_read_today: int
    items_read_previous_day: int
    diagnostics: dict[str, Any]
    push: dict[str, Any] | None  # health.push of a push kind; None otherwise


def state_of(facts: Facts, now: datetime) -> str:
    if not facts.enabled:
        return "disabled"
    push_error = (facts.push or {}).get("error") or {}
    if (facts.last_error or {}).get("error_class") == "access" or (
            (facts.push or {}).get("state") == "failed" and push_error.get("class") == "access"):
        return "access_error"
    if facts.credential_expires_at is not None and \
            facts.credential_expires_at - now <= timedelta(seconds=facts.credential_warning_seconds):
        return "credential_expiring"
    if now - (facts.last_item_at or facts.created_at) >= timedelta(seconds=facts.silent_after_seconds):
        return "silent"
    return "active"


def health_of(facts: Facts, now: datetime) -> dict[str, Any]:
    """The Health object as the API shows it, evaluated at `now`."""
    today = now.date()
    same_day = facts.usage_day == today
    usage = {"day": today.isoformat(), "items_read": facts.items_read_today if same_day else 0,
             "previous_day_items_read": facts.items_read_previous_day if same_day else (
                 facts.items_read_today if facts.usage_day == today - timedelta(days=1) else 0)}
    out: dict[str, Any] = {"state": state_of(facts, now), "evaluated_at": iso(now), "usage": usage,
                           "diagnostics": facts.diagnostics}
    if facts.last_success_at is not None:
        out["last_success_at"] = iso(facts.last_success_at)
    if facts.last_item_at is not None:
        out["last_item_at"] = iso(facts.last_item_at)
    if facts.last_error is not None:
        out["last_error"] = {"code": facts.last_error["code"], "at": facts.last_error["at"]}
    if facts.push is not None:
        out["push"] = facts.push
    return out


def moved(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """`connector.changed` is committed only when health.state or health.push.state moves."""
    old = old or {}
    return old.get("state") != new.get("state") or \
        (old.get("push") or {}).get("state") != (new.get("push") or {}).get("state")
