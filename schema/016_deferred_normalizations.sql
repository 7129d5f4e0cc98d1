-- Receipt processing waiting for a normalizer plugin that was unreachable or answered a
-- retryable error (projectors/materializer.py). Written with the materializer's checkpoint,
-- so the work survives a restart; it keeps the plan it started under (pinned work).
CREATE TABLE materializer_deferred (
    receipt_id       text PRIMARY KEY,
    org_id           text NOT NULL,
    corpus_id        text NOT NULL,
    namespace        text NOT NULL,
    record_key       text NOT NULL,
    position         bigint NOT NULL,   -- the ingest.accepted event
    plan_id          text NOT NULL,
    registration_id  text NOT NULL,
    attempts         integer NOT NULL,  -- attempts that did not answer
    budget_spent     integer NOT NULL,  -- of them, retryable errors and timeouts (the manifest's budget)
    next_attempt_at  timestamptz NOT NULL,
    last_error       text NOT NULL
);
CREATE INDEX materializer_deferred_identity ON materializer_deferred (org_id, corpus_id, namespace, record_key);
CREATE INDEX materializer_deferred_registration ON materializer_deferred (registration_id);
