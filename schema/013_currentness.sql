-- Currentness moves when a newer Version can serve (projectors/currentness.py).
--
-- records.current_version_id is now set by the availability event that makes a
-- Version current (retrieval_ready, is_current true), no longer by record.accepted;
-- latest_version_id is the Record's newest Version that can serve (not
-- quarantined): what the search indexes hold for it, current or still building.
ALTER TABLE records ADD COLUMN latest_version_id text;
UPDATE records SET latest_version_id = current_version_id;

-- The lexical projector's own state, committed with the events it appends: the
-- Version it last made current per Record, and whether the index still holds
-- older Versions' documents (retired false) to remove once the read model shows
-- that Version current.
CREATE TABLE lexical_currentness (
    record_id   text PRIMARY KEY,
    version_id  text NOT NULL,
    retired     boolean NOT NULL
);
CREATE INDEX lexical_currentness_to_retire ON lexical_currentness (record_id) WHERE NOT retired;
INSERT INTO lexical_currentness (record_id, version_id, retired)
SELECT record_id, current_version_id, true FROM records WHERE current_version_id IS NOT NULL
ON CONFLICT DO NOTHING;
