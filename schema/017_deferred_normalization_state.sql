-- Every Version a normalizer plugin serves now waits here from its first call on, so that no
-- plugin call runs inside a database transaction (projectors/materializer.py). A row fixes the
-- Record and Version ids its requests carry, and keeps each Blob Part's first recorded answer:
-- a later answer under the same idempotency key that differs is `normalizer_conflict`, and the
-- first one is published (part 1, Diagnostic).
ALTER TABLE materializer_deferred
    ADD COLUMN record_id  text,
    ADD COLUMN version_id text,
    ADD COLUMN answers    jsonb NOT NULL DEFAULT '{}'::jsonb;
