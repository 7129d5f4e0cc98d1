"""The Delivery's journal event (decisions-part2, "Change-feed event kinds added"): `delivery.changed`,
public, committed in the Corpus of the Match, subject `delivery`, at each move of a Delivery's `state`
or `held`. Its payload (not shown on the change feed, which carries ids only) records the move.

It sits below the journal, like plugins/events.py, so that `journal/events.py` can list it in the
one catalogue the codec decodes. Member names never change once written.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

DELIVERY_CHANGED = "delivery.changed"


class DeliveryChanged(msgspec.Struct, kw_only=True, tag_field="kind", tag=DELIVERY_CHANGED):
    public: ClassVar[bool] = True
    delivery_id: str
    match_id: str
    state: str  # pending, succeeded or failed
    held: str | None = None  # subscription_disabled, subscription_deleted or destination_unconfigured
    attempts: int
    last_error: dict[str, Any] | UnsetType = UNSET  # {code, status_code?, at}
    changed_at: str
