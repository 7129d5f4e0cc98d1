-- Besides contentsvc_journal (every append: what the folds listen to), an append notifies
-- contentsvc_journal_FAMILY once for each family of the kinds it holds (`connector` for
-- connector.run.changed), so a worker that acts on a few families listens to those alone and is
-- not woken by every ingest (projectors/runner.py, Projector.wakes_on).
CREATE OR REPLACE FUNCTION journal_append(
    p_event_ids text[], p_kinds text[], p_public boolean[], p_org_ids text[], p_corpus_ids text[],
    p_subject_types text[], p_subject_ids text[], p_version_ids text[], p_receipt_ids text[],
    p_payloads jsonb[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(457136501358);  -- 'journ' in ASCII: the journal lock
    INSERT INTO journal (position, event_id, kind, public, org_id, corpus_id,
                         subject_type, subject_id, version_id, receipt_id, payload)
    SELECT nextval('journal_position_seq'), e.event_id, e.kind, e.public, e.org_id, e.corpus_id,
           e.subject_type, e.subject_id, e.version_id, e.receipt_id, e.payload
    FROM unnest(p_event_ids, p_kinds, p_public, p_org_ids, p_corpus_ids, p_subject_types,
                p_subject_ids, p_version_ids, p_receipt_ids, p_payloads)
         WITH ORDINALITY AS e(event_id, kind, public, org_id, corpus_id,
                              subject_type, subject_id, version_id, receipt_id, payload, ord)
    ORDER BY e.ord;
    PERFORM pg_notify('contentsvc_journal', '');
    PERFORM pg_notify('contentsvc_journal_' || family, '')
    FROM (SELECT DISTINCT split_part(kind, '.', 1) AS family FROM unnest(p_kinds) AS kind) AS families;
END $$;
