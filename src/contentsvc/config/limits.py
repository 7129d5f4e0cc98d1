"""The fixed limits of part 1 of the contract ("Limits"): not configurable."""

from __future__ import annotations

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

# Part 2, ScheduleChange: a Connector runs at least once a day. A source's retry_after_seconds is
# kept to the same bound (plugins/client.py retry_after).
MAX_CONNECTOR_INTERVAL_SECONDS = 86400
