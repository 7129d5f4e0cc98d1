-- API keys: only a SHA-256 of the secret is stored.
CREATE TABLE api_keys (
    key_id       text PRIMARY KEY,
    org_id       text NOT NULL,
    name         text,
    actions      text[] NOT NULL,
    corpora      text[],              -- NULL: every Corpus of the Organization
    secret_hash  bytea NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);

-- One row per (Organization, route family, key): the canonical request's
-- digest and the resource it produced. Written in the command's transaction.
CREATE TABLE idempotency_keys (
    org_id          text NOT NULL,
    family          text NOT NULL,
    key             text NOT NULL,
    request_digest  bytea NOT NULL,
    status          integer NOT NULL,
    resource_type   text NOT NULL,
    resource_id     text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, family, key)
);
