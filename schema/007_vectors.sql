-- Vectors are durable artifacts: the hnswlib index of a generation is a
-- derived, snapshotted cache rebuilt from this table, never re-embedded.
CREATE TABLE vectors (
    label          bigserial UNIQUE,          -- the hnswlib label
    space          text NOT NULL,
    version_id     text NOT NULL,
    part_key       text NOT NULL,
    segment_start  integer NOT NULL,
    org_id         text NOT NULL,
    corpus_id      text NOT NULL,
    record_id      text NOT NULL,
    vector         bytea NOT NULL,            -- float32, little-endian, unit norm
    PRIMARY KEY (space, version_id, part_key, segment_start)
);
CREATE INDEX vectors_by_record ON vectors (record_id);

-- A Version's enrichment (its vectors exist) is a fold of record.enriched.
ALTER TABLE versions ADD COLUMN enriched boolean NOT NULL DEFAULT false;
