"""Text as PostgreSQL stores it: a text or jsonb value cannot hold U+0000."""

from __future__ import annotations


def storable(text: str) -> str:
    """`text` with U+FFFD for each U+0000: for words that quote what a plugin sent (its error
    message, the build it names, a pointer to a member whose name holds U+0000), which are stored
    in diagnostics, check reports and run errors. What a client sends is refused instead
    (domain/decoding.py nul_pointer)."""
    return text.replace("\x00", "\ufffd")
