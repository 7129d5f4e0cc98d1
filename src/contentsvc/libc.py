"""C library calls the standard library lacks (Linux, glibc), looked up once in the symbols the
process already has loaded: no library search, and nothing to load after a fork."""

from __future__ import annotations

import ctypes
from typing import Any, Callable

try:
    _PROCESS = ctypes.CDLL(None, use_errno=True)
except (OSError, TypeError):  # no dynamic symbol table to search (not a POSIX platform)
    _PROCESS = None


def libc_function(name: str, argtypes: list[Any] | None = None) -> Callable[..., int] | None:
    """The C function `name` returning an int, or None where this platform's C library has none.
    Without `argtypes`, arguments are passed as ctypes converts them (for a varargs function)."""
    fn = getattr(_PROCESS, name, None)
    if fn is None:
        return None
    if argtypes is not None:
        fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn
