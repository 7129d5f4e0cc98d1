"""The start-up heap of a long-running process, kept out of the garbage collector's walks."""

from __future__ import annotations

import gc


def freeze_start_up_heap() -> None:
    """What start-up made (modules, the app and its routes, schemas: some 100,000 objects in the
    API) lives as long as the process. Frozen, a full collection no longer walks it: under load one
    did every few seconds and paused everything in flight for 40-60 ms (seen with gc.callbacks);
    in a fold, perhaps with the journal lock held."""
    gc.collect()
    gc.freeze()
