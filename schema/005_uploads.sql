-- Uploads and Blobs (part 1 rules 7, 8). Both tables are folds of the
-- upload.* journal events (projectors/readmodel.py), written inline by the
-- commands that append them, so a replay from position 0 yields the same rows.
--
-- `step` orders an upload's lifecycle (0 created, 1 bytes received,
-- 2 verified or failed): a fold moves a row only forward, so an older event
-- folded after a newer one (the projector catching up behind an inline
-- fold) changes nothing.
CREATE TABLE uploads (
    upload_id        text PRIMARY KEY,
    org_id           text NOT NULL,
    blob_id          text NOT NULL UNIQUE,
    state            text NOT NULL,
    step             smallint NOT NULL,
    media_type       text NOT NULL,
    size_bytes       bigint NOT NULL,
    sha256           text NOT NULL,
    filename         text,
    expires_at       timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    received_size    bigint,
    received_sha256  text,
    storage_key      text,
    error            jsonb
);

-- Verified Blobs only: getBlob and ingest read here.
CREATE TABLE blobs (
    blob_id      text PRIMARY KEY,
    org_id       text NOT NULL,
    upload_id    text NOT NULL,
    media_type   text NOT NULL,
    size_bytes   bigint NOT NULL,
    sha256       text NOT NULL,
    storage_key  text NOT NULL,
    created_at   timestamptz NOT NULL
);

-- The presigned PUT URLs' signing key (see contentsvc/domain/uploads.py).
INSERT INTO service_secrets (name, secret)
VALUES ('upload_hmac', decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'))
ON CONFLICT DO NOTHING;
