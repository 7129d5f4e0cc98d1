-- Search index generations. One generation per kind serves searches; a
-- rebuild or replay builds another beside it and cuts over atomically.
-- Each generation's journal position is its projector checkpoint row
-- (projector_checkpoints.name = '<kind>:<generation_id>').
CREATE TABLE search_generations (
    generation_id  text PRIMARY KEY,
    kind           text NOT NULL,           -- 'lexical'
    state          text NOT NULL,           -- 'building', 'serving', 'retired'
    announced      bigint NOT NULL DEFAULT 0, -- building_baseline published through this position
    created_at     timestamptz NOT NULL DEFAULT now(),
    activated_at   timestamptz
);
CREATE UNIQUE INDEX search_generations_one_serving ON search_generations (kind) WHERE state = 'serving';
