-- API processes cache each pushed-to Connector with the kind that serves it (connectors/
-- push_routes.py), so that a push does not read them. A change to what a push uses is announced
-- on contentsvc_connectors (the Connector's id: its entry is dropped), a new plan on
-- contentsvc_plans (kinds may now be served otherwise: every entry is dropped). Triggers, so that
-- every path is covered. The worker's own columns (checkpoint, schedule clock, usage counters)
-- are not among those announced: a push does not read them, and they change at every run.

-- pg_notify(channel TG_ARGV[0], the changed row's column TG_ARGV[1]).
CREATE FUNCTION announce_row_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], to_jsonb(CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END) ->> TG_ARGV[1]);
    RETURN NULL;
END;
$$;

CREATE TRIGGER connectors_push_changed
    AFTER UPDATE OF org_id, corpus_id, source_namespace, kind, plugin_id, config, push_policy, enabled, revision,
                    health, credential, credential_version
       OR DELETE ON connectors
    FOR EACH ROW EXECUTE FUNCTION announce_row_change('contentsvc_connectors', 'connector_id');

CREATE TRIGGER plugin_plan_committed AFTER INSERT ON plugin_plans
    FOR EACH ROW EXECUTE FUNCTION announce_row_change('contentsvc_plans', 'plan_id');
