"""Settings read from the environment, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _int_env(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


def _duration_env(name: str, default_seconds: int) -> int:
    """Seconds, or a number with a unit suffix: 30s, 15m, 12h, 7d."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default_seconds
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if raw[-1] in units:
        return int(float(raw[:-1]) * units[raw[-1]])
    return int(raw)


@dataclass(frozen=True)
class Settings:
    database_url: str | None
    home: Path
    host: str
    port: int
    change_retention_seconds: int
    idle_checkpoint_seconds: int
    # Uploads and Blobs (part 1 rules 7, 8; "Limits": one Blob 1 GiB, configurable).
    max_blob_bytes: int = 1024 * 1024 * 1024
    upload_url_ttl_seconds: int = 3600

    @property
    def blob_root(self) -> Path:
        """Where the filesystem blob store keeps its files (CONTENTSVC_HOME/blobs)."""
        return self.home / "blobs"

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            database_url=os.environ.get("CONTENTSVC_DATABASE_URL") or None,
            home=Path(os.environ.get("CONTENTSVC_HOME", ".contentsvc")).resolve(),
            host=os.environ.get("CONTENTSVC_HOST", "127.0.0.1"),
            port=_int_env("CONTENTSVC_PORT", 8080),
            change_retention_seconds=_duration_env("CONTENTSVC_CHANGE_RETENTION", 7 * 86400),
            idle_checkpoint_seconds=_int_env("CONTENTSVC_STREAM_CHECKPOINT_SECONDS", 15),
            max_blob_bytes=_int_env("CONTENTSVC_MAX_BLOB_BYTES", 1024 * 1024 * 1024),
            upload_url_ttl_seconds=_duration_env("CONTENTSVC_UPLOAD_URL_TTL", 3600),
        )


# Limits of part 1 of the contract ("Limits").
MAX_INGEST_BYTES = 1024 * 1024
MAX_BATCH_BYTES = 10 * 1024 * 1024
MAX_BATCH_ENTRIES = 100
MAX_PARTS = 256
MAX_RELATIONS = 64
MAX_DIAGNOSTICS = 20
RECORD_PAGE_DEFAULT = 100
RECORD_PAGE_MAX = 100
CHANGE_PAGE_DEFAULT = 100
CHANGE_PAGE_MAX = 1000

# The built-in text path holds a text Blob's whole text in its Version's
# manifest: larger text Blobs are quarantined (normalizer_failed).
MAX_TEXT_BLOB_BYTES = 8 * 1024 * 1024
