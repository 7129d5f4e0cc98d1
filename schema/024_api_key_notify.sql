-- API processes cache the Principal of each key they have seen; any change to a key (a
-- revocation above all) is announced on contentsvc_keys, and every cache drops what it holds.
-- A trigger, so that a change made by any path (`contentsvc keys revoke`, plain SQL) is announced.
CREATE FUNCTION api_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('contentsvc_keys', coalesce(OLD.key_id, ''));
    RETURN NULL;
END;
$$;

CREATE TRIGGER api_keys_changed AFTER UPDATE OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION api_keys_changed();
