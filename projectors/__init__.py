"""Projectors: independent processes that fold the journal.

Each module holds one projector; REGISTRY names them for
`contentsvc projector run NAME`.
"""

from __future__ import annotations


def registry() -> dict:
    from contentsvc.config import current_settings
    from contentsvc.projectors.lexical import LexicalProjector
    from contentsvc.projectors.materializer import MaterializerProjector
    from contentsvc.projectors.readmodel import ReadModelProjector
    from contentsvc.projectors.vectors import VectorProjector

    home = current_settings().home
    projectors = (MaterializerProjector(), ReadModelProjector(), LexicalProjector(home), VectorProjector(home))
    return {p.name: p for p in projectors}
