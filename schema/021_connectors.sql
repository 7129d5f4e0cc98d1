-- Connectors (part 2 "Connector", "Connector health and push"; decisions-part2 "Connectors").
--
-- `connectors` is the read model of the `connector.committed` facts (the management commands
-- write it inline with their events) plus the state the `connectors` worker keeps beside it: the
-- checkpoint, the schedule's clock, usage counters. The checkpoint and the credential ciphertext
-- are never returned by the API. `connector_runs` holds every run; `connector_instance_tokens`
-- holds only the SHA-256 of each token.

CREATE TABLE connectors (
    connector_id             text PRIMARY KEY,
    org_id                   text NOT NULL,
    corpus_id                text NOT NULL,
    source_namespace         text NOT NULL,
    kind                     text NOT NULL,
    plugin_id                text,              -- the serving plugin at creation; NULL for the built-in fixture kind
    config                   jsonb NOT NULL,
    interval_seconds         integer NOT NULL,
    health_policy            jsonb NOT NULL,    -- effective {silent_after_seconds, credential_warning_seconds}
    push_policy              jsonb,             -- effective; push kinds only
    enabled                  boolean NOT NULL DEFAULT true,
    revision                 integer NOT NULL DEFAULT 1,
    created_at               timestamptz NOT NULL,
    disabled_at              timestamptz,
    health                   jsonb NOT NULL,    -- the last committed Connector Health
    credential               jsonb,             -- {key_id, nonce, ciphertext}, base64; NULL: none deposited
    credential_version       integer NOT NULL DEFAULT 0,
    credential_deposited_at  timestamptz,
    credential_expires_at    timestamptz,       -- the deposit's, else check_credential's
    checkpoint               jsonb,             -- the last committed page's; NULL before the first
    next_run_at              timestamptz,       -- the next scheduled start; NULL once disabled
    last_scheduled_start     timestamptz,
    last_run_started_at      timestamptz,
    retry_after_until        timestamptz,       -- a source's retry_after_seconds deadline
    last_item_at             timestamptz,       -- the last page that created a Receipt
    last_success_at          timestamptz,
    usage_day                date,              -- UTC day of the counters below
    items_read_today         bigint NOT NULL DEFAULT 0,
    items_read_previous_day  bigint NOT NULL DEFAULT 0,
    reads_today              bigint NOT NULL DEFAULT 0
);
-- namespace_in_use: one enabled Connector per Corpus and source namespace.
CREATE UNIQUE INDEX connectors_enabled_namespace ON connectors (corpus_id, source_namespace) WHERE enabled;
CREATE INDEX connectors_by_org ON connectors (org_id, connector_id);
CREATE INDEX connectors_due ON connectors (next_run_at) WHERE enabled;

CREATE TABLE connector_runs (
    run_id            text PRIMARY KEY,
    connector_id      text NOT NULL REFERENCES connectors (connector_id),
    org_id            text NOT NULL,
    corpus_id         text NOT NULL,
    trigger           text NOT NULL CHECK (trigger IN ('schedule', 'request')),
    state             text NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'skipped')),
    plan_id           text,                     -- set when it starts
    pages             integer NOT NULL DEFAULT 0,
    items_seen        integer NOT NULL DEFAULT 0,
    receipts_created  integer NOT NULL DEFAULT 0,
    items_rejected    integer NOT NULL DEFAULT 0,
    run_at            timestamptz NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz,
    error             jsonb,                    -- {code, message, error_class?}
    notice            text
);
CREATE INDEX connector_runs_by_connector ON connector_runs (connector_id, run_id DESC);
CREATE INDEX connector_runs_queued ON connector_runs (run_at) WHERE state = 'queued';
-- One queued and one running run at most per Connector (decisions-part2 "Runs").
CREATE UNIQUE INDEX connector_runs_one_queued ON connector_runs (connector_id) WHERE state = 'queued';
CREATE UNIQUE INDEX connector_runs_one_running ON connector_runs (connector_id) WHERE state = 'running';

CREATE TABLE connector_instance_tokens (
    token_id       text PRIMARY KEY,
    connector_id   text NOT NULL REFERENCES connectors (connector_id),
    org_id         text NOT NULL,
    name           text,
    secret_sha256  bytea NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL,
    expires_at     timestamptz,
    revoked_at     timestamptz
);
CREATE INDEX connector_instance_tokens_by_connector ON connector_instance_tokens (connector_id, token_id);
