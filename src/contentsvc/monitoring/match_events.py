"""The Match's journal events (decisions-part2, "Change-feed event kinds added"): `match.created`
and `match.withdrawn`, public, committed in the Corpus of the Match, subject `match`, `version_id`
set to the matched Record Version. The change feed shows ids only; the payload records the fact.

Below the journal, like delivery_events.py, so `journal/events.py` lists them in its catalogue.
Member names never change once written.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
from msgspec import UNSET, UnsetType

MATCH_CREATED = "match.created"
MATCH_WITHDRAWN = "match.withdrawn"
MATCH_SUBJECT = "match"


class _MatchChange(msgspec.Struct, kw_only=True, tag_field="kind"):
    public: ClassVar[bool] = True
    match_id: str
    subscription_id: str
    subscription_version_id: str
    record_id: str
    version_id: str


class MatchCreated(_MatchChange, kw_only=True, tag=MATCH_CREATED):
    created_at: str


class MatchWithdrawn(_MatchChange, kw_only=True, tag=MATCH_WITHDRAWN):
    reason: str  # record_withdrawn or version_replaced
    withdrawn_at: str
    delivery_id: str | UnsetType = UNSET


MATCH_PAYLOADS = (MatchCreated, MatchWithdrawn)
