-- The plugin registry's read tables (src/contentsvc/plugins/registry.py folds the plugin.*
-- events into them, inline, in the transaction that appends them).

CREATE TABLE plugin_registrations (
    registration_id  text PRIMARY KEY,
    plugin_id        text NOT NULL,
    version          text NOT NULL,
    endpoint         text NOT NULL,
    manifest         text NOT NULL,
    manifest_digest  text NOT NULL,
    artifact_digest  text,
    settings         jsonb NOT NULL,
    contributions    jsonb NOT NULL,
    roles            jsonb NOT NULL,
    state            text NOT NULL,
    origin           text NOT NULL,
    has_token        boolean NOT NULL,
    check_report     jsonb,          -- NULL until its contract check ran
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL
);
-- The worker's queue: registrations whose check has not run yet.
CREATE INDEX plugin_registrations_unchecked ON plugin_registrations (created_at) WHERE check_report IS NULL;
CREATE INDEX plugin_registrations_draining ON plugin_registrations (registration_id) WHERE state = 'draining';

-- Plans in commit order: the one with the highest seq is active.
CREATE TABLE plugin_plans (
    seq                 bigserial UNIQUE,
    plan_id             text PRIMARY KEY,
    source              text NOT NULL,
    previous_plan_id    text,
    roles               jsonb NOT NULL,
    configuration_pins  jsonb,
    pinned_work         text,
    created_at          timestamptz NOT NULL,
    activated_at        timestamptz NOT NULL
);
