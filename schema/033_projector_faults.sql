-- A projector or worker whose step fails (anything but a lost database) keeps retrying where it
-- is, and says so here until a step gets past the failure (projectors/faults.py): which error,
-- on which event when a fold step failed, how often and since when. `contentsvc projector
-- status` and `worker status` show these rows.
CREATE TABLE projector_faults (
    name             text PRIMARY KEY,  -- the projector's or worker's name
    error            text NOT NULL,     -- the exception's class
    message          text NOT NULL,
    first_position   bigint,            -- the events of the failing step, when it read any
    last_position    bigint,
    kind             text,              -- their kind, when they have one
    attempts         integer NOT NULL DEFAULT 1,
    first_failed_at  timestamptz NOT NULL DEFAULT now(),
    last_failed_at   timestamptz NOT NULL DEFAULT now()
);
