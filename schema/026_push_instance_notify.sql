-- API processes cache each pushed-to Connector with the kind that serves it (connectors/
-- push_routes.py), so that a push does not read them. A change to what a push uses is announced
-- on contentsvc_connectors (the Connector's id: its entry is dropped), a new plan on
-- contentsvc_plans (kinds may now be served otherwise: every entry is dropped). Triggers, so that
-- every path is covered. The worker's own columns (checkpoint, schedule clock, usage counters)
-- are not among those announced: a push does not read them, and they change at every run.
CREATE FUNCTION connectors_push_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('contentsvc_connectors', OLD.connector_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER connectors_push_changed
    AFTER UPDATE OF org_id, corpus_id, source_namespace, kind, plugin_id, config, push_policy, enabled, revision,
                    health, credential, credential_version
       OR DELETE ON connectors
    FOR EACH ROW EXECUTE FUNCTION connectors_push_changed();

CREATE FUNCTION plugin_plan_committed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('contentsvc_plans', NEW.plan_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER plugin_plan_committed AFTER INSERT ON plugin_plans
    FOR EACH ROW EXECUTE FUNCTION plugin_plan_committed();
