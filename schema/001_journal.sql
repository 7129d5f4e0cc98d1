-- The journal: every fact of the service, in one order.
--
-- Positions come from journal_position_seq, drawn only while the appending
-- transaction holds the journal advisory lock (see journal/store.py), and
-- the lock is released only after the commit is visible. So positions are
-- handed out in commit order, and a reader that has seen position P never
-- later finds a committed event below P.
CREATE SEQUENCE journal_position_seq AS bigint;

CREATE TABLE journal (
    position      bigint PRIMARY KEY,
    event_id      text NOT NULL UNIQUE,
    kind          text NOT NULL,
    public        boolean NOT NULL,
    org_id        text NOT NULL,
    corpus_id     text,
    subject_type  text NOT NULL,
    subject_id    text NOT NULL,
    version_id    text,
    receipt_id    text,
    payload       jsonb NOT NULL,
    committed_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The change feed reads one Organization's public events of one Corpus.
CREATE INDEX journal_feed ON journal (org_id, corpus_id, position) WHERE public;

-- The journal is append-only: no update or delete, ever.
CREATE FUNCTION journal_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the journal is append-only';
END $$;
CREATE TRIGGER journal_append_only BEFORE UPDATE OR DELETE ON journal
    FOR EACH ROW EXECUTE FUNCTION journal_refuse_change();

-- Each projector's position, committed with its output.
CREATE TABLE projector_checkpoints (
    name        text PRIMARY KEY,
    position    bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Signing keys shared by every process (cursors).
CREATE TABLE service_secrets (
    name    text PRIMARY KEY,
    secret  bytea NOT NULL
);
-- gen_random_uuid draws from the server's strong random source: 244 random bits.
INSERT INTO service_secrets (name, secret)
VALUES ('cursor_hmac', decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'))
ON CONFLICT DO NOTHING;
