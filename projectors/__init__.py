"""Projectors: independent processes that fold the journal.

Each module holds one projector; REGISTRY names them for
`contentsvc projector run NAME`.
"""

from __future__ import annotations


def registry() -> dict:
    from contentsvc.config import Settings
    from contentsvc.projectors.lexical import LexicalProjector
    from contentsvc.projectors.materializer import MaterializerProjector
    from contentsvc.projectors.readmodel import ReadModelProjector
    from contentsvc.projectors.vectors import VectorProjector

    settings = Settings.from_env()
    projectors = (MaterializerProjector, ReadModelProjector, LexicalProjector, VectorProjector)
    return {p.name: p.from_settings(settings) for p in projectors}
