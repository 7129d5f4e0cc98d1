"""Operator commands behind the CLI: projector status, replays and per-Corpus rebuilds."""
