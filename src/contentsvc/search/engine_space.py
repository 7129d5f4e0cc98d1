"""The engine-owned vector space: its name, and whether new Corpora get it. Apart from the
vector index so that processes which only name the space do not load numpy and hnswlib."""

from __future__ import annotations

from contentsvc.config import current_settings

SPACE = "minilm_l6_v2"


def engine_vectors_enabled() -> bool:
    """New Corpora get the engine's vector space unless `search.engine_vectors` is off
    (CONTENTSVC_ENGINE_VECTORS=0)."""
    return current_settings().search.engine_vectors
