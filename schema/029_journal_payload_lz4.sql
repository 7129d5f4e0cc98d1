-- New journal payloads are compressed with LZ4 rather than pglz where the server has it
-- (PostgreSQL 14 and later, built with lz4, as Debian's and the official images are): a
-- Version's payload carries its text, and it is compressed while the appending transaction
-- holds the journal lock (docs/decisions.md, "Records and Receipts"). Rows already written keep
-- theirs; both read back the same.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        ALTER TABLE journal ALTER COLUMN payload SET COMPRESSION lz4;
    END IF;
END $$;
