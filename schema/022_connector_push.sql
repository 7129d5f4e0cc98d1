-- Push routes and the webhook relay (part 2 "Declared push route" rules 10-12; decisions-part2
-- "Push routes, relay, push_policy, proxies", "Instance tokens").
--
-- connector_push_replays: per Connector and Idempotency-Key, the first completed answer of a
-- service_key or instance_token route (status NULL while the first attempt is under way), kept
-- for `[connectors] idempotency_ttl_seconds`. connector_push_fingerprints: signatures and keys of
-- signature routes, reserved for the route's window before the plugin is called.
-- connector_push_counters: the per-Connector admin counters, written with each audit event.

CREATE TABLE connector_push_replays (
    connector_id     text NOT NULL,
    idempotency_key  text NOT NULL,
    route            text NOT NULL,
    status           integer,
    content_type     text,
    body             bytea,
    expires_at       timestamptz NOT NULL,
    PRIMARY KEY (connector_id, idempotency_key)
);
CREATE INDEX connector_push_replays_expiry ON connector_push_replays (expires_at);

CREATE TABLE connector_push_fingerprints (
    connector_id  text NOT NULL,
    fingerprint   bytea NOT NULL,
    expires_at    timestamptz NOT NULL,
    PRIMARY KEY (connector_id, fingerprint)
);
CREATE INDEX connector_push_fingerprints_expiry ON connector_push_fingerprints (expires_at);

CREATE TABLE connector_push_counters (
    connector_id      text PRIMARY KEY,
    received          bigint NOT NULL DEFAULT 0,
    refused           bigint NOT NULL DEFAULT 0,
    replayed          bigint NOT NULL DEFAULT 0,
    rate_limited      bigint NOT NULL DEFAULT 0,
    last_received_at  timestamptz,
    last_refused_at   timestamptz
);
