"""contentsvc: a content service on an append-only journal."""

__version__ = "0.1.0"
