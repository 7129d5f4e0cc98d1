-- Operations (rebuilds, retrieval configurations) as the API shows them: a
-- fold of operation.changed events. `doc` is the public Operation; `request`
-- holds what a rerun repeats (never shown: an Operation reports progress and
-- outcome, not the pending configuration).
CREATE TABLE operations (
    operation_id  text PRIMARY KEY,
    org_id        text NOT NULL,
    corpus_id     text,
    doc           jsonb NOT NULL,
    request       jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- A Corpus's projection generations: logical, immutable builds of its
-- retrieval configuration. Every one lives inside the physical lexical index
-- (documents carry its id); exactly one per Corpus serves (is routed to).
-- The first comes with the Corpus; the lexical projector creates the others
-- for Operations, fills them, and cuts over.
CREATE TABLE corpus_projections (
    projection_generation_id  text PRIMARY KEY,
    org_id                    text NOT NULL,
    corpus_id                 text NOT NULL,
    retrieval                 jsonb NOT NULL,
    vector_spaces             jsonb NOT NULL,
    state                     text NOT NULL,   -- building, serving, retired, failed, canceled
    operation_id              text,            -- null for the Corpus's first generation
    operation_kind            text,
    accepted_position         bigint NOT NULL, -- when its Operation (or the Corpus) was accepted
    config_position           bigint NOT NULL, -- when its retrieval configuration was accepted
    backfill_index            text,            -- the physical index generation the cursor is valid for
    backfill_cursor           text NOT NULL DEFAULT '',  -- last record_id filled
    versions_in_scope         bigint NOT NULL DEFAULT 0,
    versions_done             bigint NOT NULL DEFAULT 0,
    ended_at                  timestamptz,     -- retired, failed or canceled
    purged                    boolean NOT NULL DEFAULT false  -- its documents are gone from the index
);
CREATE UNIQUE INDEX corpus_projections_one_serving ON corpus_projections (org_id, corpus_id) WHERE state = 'serving';

-- A backfill reads, per Record of one Corpus, its latest record event.
CREATE INDEX journal_record_history ON journal (org_id, corpus_id, subject_id, position DESC)
    WHERE kind IN ('record.accepted', 'record.withdrawn');

-- Corpora created before this migration: their first generation serves.
INSERT INTO corpus_projections (projection_generation_id, org_id, corpus_id, retrieval, vector_spaces, state,
                                accepted_position, config_position)
SELECT projection_generation_id, org_id, corpus_id, retrieval, vector_spaces, 'serving', 0, 0 FROM corpora
ON CONFLICT DO NOTHING;
