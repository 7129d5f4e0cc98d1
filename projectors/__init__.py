"""Projectors: independent processes that fold the journal.

Each module holds one projector; REGISTRY names them for
`contentsvc projector run NAME`.
"""

from __future__ import annotations


def registry() -> dict:
    from contentsvc.config import Settings
    from projectors.lexical import LexicalProjector
    from projectors.materializer import MaterializerProjector
    from projectors.readmodel import ReadModelProjector

    home = Settings.from_env().home
    return {p.name: p for p in (MaterializerProjector(), ReadModelProjector(), LexicalProjector(home))}
