-- Matches and the `monitor` evaluator worker's state (decisions-part2 "Evaluation trigger and
-- eligibility", "Matches"). The worker folds the journal from its checkpoint; everything here is
-- written by it (src/contentsvc/monitoring/matches.py), in the checkpoint's transaction or in the
-- transaction that settles one evaluator answer.

-- Each Subscription's state after each of its `subscription.committed` events, at that event's
-- journal position: the judging Version (the latest activated before a position) and whether it
-- was enabled there are read at the position of the event being folded, so folding the journal
-- again from an earlier checkpoint decides exactly as the first time.
CREATE TABLE monitor_subscription_history (
    subscription_id  text NOT NULL,
    position         bigint NOT NULL,
    org_id           text NOT NULL,
    version_id       text NOT NULL,   -- the current Version after this event
    corpus_ids       text[] NOT NULL, -- that Version's pinned Saved Query Version's
    enabled          boolean NOT NULL,
    deleted          boolean NOT NULL,
    PRIMARY KEY (subscription_id, position)
);
CREATE INDEX monitor_subscription_history_by_org ON monitor_subscription_history (org_id, subscription_id, position);

-- One row per (Subscription Version, Record Version) ever triggered: one evaluation each, never
-- two (a Version made current again is not evaluated again). `state`: pending (to call, or
-- not_ready waiting for a trigger when next_attempt_at is NULL), decided (match or no_match),
-- failed (terminal error or invalid output), dropped (no longer eligible).
CREATE TABLE monitor_evaluations (
    subscription_version_id  text NOT NULL,
    version_id               text NOT NULL,
    subscription_id          text NOT NULL,
    org_id                   text NOT NULL,
    corpus_id                text NOT NULL,
    record_id                text NOT NULL,
    trigger_position         bigint NOT NULL, -- the journal position of the event that triggered it
    state                    text NOT NULL CHECK (state IN ('pending', 'decided', 'failed', 'dropped')),
    attempts                 integer NOT NULL DEFAULT 0,
    next_attempt_at          timestamptz,
    created_at               timestamptz NOT NULL DEFAULT now(),
    first_not_ready_at       timestamptz,
    last_error               text,
    PRIMARY KEY (subscription_version_id, version_id)
);
CREATE INDEX monitor_evaluations_due ON monitor_evaluations (next_attempt_at) WHERE state = 'pending';
CREATE INDEX monitor_evaluations_by_version ON monitor_evaluations (version_id) WHERE state = 'pending';
CREATE INDEX monitor_evaluations_by_subscription ON monitor_evaluations (subscription_id) WHERE state = 'pending';

-- Versions whose `record.enriched` the monitor has folded: the request's `enriched` is read here, so
-- a not_ready answer re-armed by record.enriched never races the readmodel projector's own fold.
CREATE TABLE monitor_enriched_versions (
    version_id  text PRIMARY KEY
);

-- The Subscription view's `evaluation` members other than `pending` (counted above).
CREATE TABLE monitor_subscription_status (
    subscription_id    text PRIMARY KEY,
    last_evaluated_at  timestamptz,
    last_error         jsonb           -- {code, at}: evaluator_failed or evaluator_invalid_output
);

CREATE TABLE matches (
    match_id                 text PRIMARY KEY,
    org_id                   text NOT NULL,
    corpus_id                text NOT NULL,
    subscription_id          text NOT NULL,
    subscription_version_id  text NOT NULL,
    saved_query_id           text NOT NULL,
    saved_query_version_id   text NOT NULL,
    record_id                text NOT NULL,
    version_id               text NOT NULL,
    destination_id           text NOT NULL,
    owner                    text,
    evidence                 jsonb NOT NULL,
    state                    text NOT NULL CHECK (state IN ('active', 'withdrawn')),
    withdrawn_reason         text CHECK (withdrawn_reason IN ('record_withdrawn', 'version_replaced')),
    created_at               timestamptz NOT NULL,
    withdrawn_at             timestamptz,
    UNIQUE (subscription_version_id, version_id)
);
CREATE INDEX matches_by_subscription ON matches (subscription_id, match_id);
CREATE INDEX matches_by_record ON matches (record_id, match_id);
CREATE INDEX matches_active_by_version ON matches (version_id) WHERE state = 'active';

-- The monitor reads a Version's text and source from its record.accepted event.
CREATE INDEX journal_accepted_versions ON journal (version_id) WHERE kind = 'record.accepted';
