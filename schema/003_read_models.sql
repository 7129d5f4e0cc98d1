-- Read tables. Every row here is a fold of journal events (projectors/readmodel.py);
-- corpora and pending receipts are also written inline by the command that
-- appends their events, through the same fold, so they are readable the
-- instant the answer leaves.
CREATE TABLE corpora (
    org_id                    text NOT NULL,
    corpus_id                 text NOT NULL,
    name                      text NOT NULL,
    retrieval                 jsonb NOT NULL,
    projection_generation_id  text NOT NULL,
    vector_spaces             jsonb NOT NULL,
    created_at                timestamptz NOT NULL,
    PRIMARY KEY (org_id, corpus_id)
);

CREATE TABLE receipts (
    receipt_id   text PRIMARY KEY,
    org_id       text NOT NULL,
    corpus_id    text NOT NULL,
    namespace    text NOT NULL,
    record_key   text NOT NULL,
    state        text NOT NULL,
    outcome      text,
    record_id    text,
    version_id   text,
    diagnostics  jsonb NOT NULL,
    accepted_at  timestamptz NOT NULL,
    resolved_at  timestamptz
);

CREATE TABLE records (
    record_id           text PRIMARY KEY,
    org_id              text NOT NULL,
    corpus_id           text NOT NULL,
    namespace           text NOT NULL,
    record_key          text NOT NULL,
    current_version_id  text,
    withdrawn           boolean NOT NULL,
    created_at          timestamptz NOT NULL,
    UNIQUE (org_id, corpus_id, namespace, record_key)
);
CREATE INDEX records_by_corpus ON records (org_id, corpus_id, record_id);

CREATE TABLE versions (
    version_id          text PRIMARY KEY,
    record_id           text NOT NULL,
    org_id              text NOT NULL,
    corpus_id           text NOT NULL,
    receipt_id          text NOT NULL,
    manifest            jsonb NOT NULL,
    provenance          jsonb NOT NULL,
    extensions          jsonb,
    relations           jsonb NOT NULL,
    language            text,
    diagnostics         jsonb NOT NULL,
    availability_state  text NOT NULL,
    searchable          boolean NOT NULL,
    accepted_at         timestamptz NOT NULL,
    created_at          timestamptz NOT NULL
);

-- The materializer's own state: which Version is current per source
-- identity, committed with its checkpoint so its decisions are replayable.
CREATE TABLE materializer_identities (
    org_id              text NOT NULL,
    corpus_id           text NOT NULL,
    namespace           text NOT NULL,
    record_key          text NOT NULL,
    record_id           text NOT NULL,
    current_version_id  text,
    current_digest      bytea,
    withdrawn           boolean NOT NULL,
    PRIMARY KEY (org_id, corpus_id, namespace, record_key)
);
