-- What `contentsvc gc` (and the gc worker) may delete, decided in PostgreSQL.
--
-- An index generation's files go once it has been retired for the grace period:
-- retired_at says since when (a generation retired before this migration counts
-- from now).
ALTER TABLE search_generations ADD COLUMN retired_at timestamptz;
UPDATE search_generations SET retired_at = now() WHERE state = 'retired';

-- A Blob whose bytes were collected (blob.collected): no ingest may reference it
-- any more (unverified_blob), and getBlob no longer finds it.
ALTER TABLE blobs ADD COLUMN collected_at timestamptz;

-- Whether any ingest ever referenced a Blob: the journal's ingest.accepted
-- events carry the Blobs they reference, by blob_id (payload.blobs).
CREATE INDEX journal_blob_references ON journal USING gin ((payload -> 'blobs'))
    WHERE kind = 'ingest.accepted' AND payload ? 'blobs';

-- Which Blobs and received uploads hold a content-addressed file.
CREATE INDEX blobs_by_storage_key ON blobs (storage_key);
CREATE INDEX uploads_by_storage_key ON uploads (storage_key) WHERE storage_key IS NOT NULL;
-- The collector's candidates: Blobs not collected, by their upload's expiry.
CREATE INDEX uploads_by_expiry ON uploads (expires_at) WHERE state IN ('verified', 'verifying');
