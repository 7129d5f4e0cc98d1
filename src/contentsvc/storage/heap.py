"""The heap of a long-running process: the garbage collector's walks kept away from it and from
bulk passes, and the C allocator's freed memory kept for reuse where buffers come and go fast, or
handed back after a one-time peak."""

from __future__ import annotations

import contextlib
import ctypes
import gc

from contentsvc.libc import libc_function

# glibc's mallopt(3) parameters. Setting either also ends glibc's own adjustment of both.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024  # above this, a buffer gets pages of its own, returned when freed
TRIM_THRESHOLD_BYTES = 16 * 1024 * 1024  # free memory kept at the heap's top before it is returned
_mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
_malloc_trim = libc_function("malloc_trim", [ctypes.c_size_t])


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


def reuse_freed_buffers() -> bool:
    """Keep the buffers an upload's bytes pass through for reuse (glibc's malloc; elsewhere False).

    A PUT's body arrives in pieces of about 256 KiB, each a new bytes object twice over (the
    socket read, then the HTTP parser's body slice) and freed once hashed and written. With
    glibc's defaults the heap's free top passed its trim threshold (twice the largest buffer
    freed, here 512 KiB) again and again, so the heap gave those pages back to the kernel and
    took fresh zeroed ones for the next pieces: about 24,000 page faults per 256 MiB PUT, and a
    fifth of the API's CPU for it (docs/decisions.md, "Uploads"). Kept, at most the trim
    threshold of freed memory stays with the process."""
    if _mallopt is None:
        return False
    return bool(_mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and \
        bool(_mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def return_freed_memory() -> None:
    """Hands what the heap holds free back to the system after a one-time peak (building the
    encoder: the weights and two serialized graphs, about 115 MB), which glibc keeps otherwise, in
    every process that embeds. Not glibc: the memory is reused for later allocations anyway."""
    if _malloc_trim is not None:
        _malloc_trim(0)
