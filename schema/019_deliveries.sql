-- Deliveries and their Attempts (decisions-part2, "Deliveries"). A row is the durable record of
-- one notice for one Match (one per Match and event type); its state moves are also committed to
-- the journal as `delivery.changed` in the same transaction. `body` holds the exact WebhookEvent
-- bytes every attempt sends. The `lease_*` columns belong to the `deliveries` worker: an attempt
-- is claimed under a row lock (FOR UPDATE SKIP LOCKED) with a lease of the attempt timeout + 5 s,
-- so a crashed sender's attempt is claimed again once the lease has expired.
CREATE TABLE deliveries (
    delivery_id      text PRIMARY KEY,
    event_id         text NOT NULL UNIQUE,          -- the webhook-id, a wev_ id
    org_id           text NOT NULL,
    corpus_id        text NOT NULL,                 -- the Corpus of the Match
    match_id         text NOT NULL,
    subscription_id  text NOT NULL,
    destination_id   text NOT NULL,
    event_type       text NOT NULL CHECK (event_type IN ('match.created', 'match.withdrawn')),
    state            text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    held             text CHECK (held IN ('subscription_disabled', 'subscription_deleted',
                                          'destination_unconfigured')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    last_attempt_at  timestamptz,
    succeeded_at     timestamptz,
    failed_at        timestamptz,
    last_error       jsonb,
    created_at       timestamptz NOT NULL,
    window_ends_at   timestamptz,
    body             bytea NOT NULL,
    lease_token      text,
    lease_expires_at timestamptz,
    UNIQUE (match_id, event_type)
);

-- What the worker looks for: pending, not held, due.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state = 'pending' AND held IS NULL;
CREATE INDEX deliveries_by_subscription ON deliveries (subscription_id) WHERE state = 'pending';

CREATE TABLE delivery_attempts (
    attempt_id       text PRIMARY KEY,
    delivery_id      text NOT NULL REFERENCES deliveries (delivery_id),
    number           integer NOT NULL,
    started_at       timestamptz NOT NULL,
    finished_at      timestamptz NOT NULL,
    status_code      integer,
    error_code       text CHECK (error_code IN ('timeout', 'connect_error', 'tls_error', 'http_status',
                                                'invalid_response')),
    duration_ms      integer NOT NULL,
    response_excerpt text NOT NULL,
    UNIQUE (delivery_id, number)
);
