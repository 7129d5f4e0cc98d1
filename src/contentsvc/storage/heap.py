"""The garbage collector's walks of the heap, kept away from long-running processes and bulk passes."""

from __future__ import annotations

import contextlib
import gc


def freeze_start_up_heap() -> None:
    """What start-up made (modules, the app and its routes, schemas: some 100,000 objects in the
    API) lives as long as the process. Frozen, a full collection no longer walks it: under load one
    did every few seconds and paused everything in flight for 40-60 ms (seen with gc.callbacks);
    in a fold, perhaps with the journal lock held."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def no_cycle_collections():
    """The cyclic garbage collector off for a bulk pass (a lexical replay). Its events and
    documents are freed by reference counting (they hold no cycles), yet their allocations set
    off collections, each one walking the whole heap while the index writer's threads wait for
    documents (6% of a SciFact replay's samples were in them)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
