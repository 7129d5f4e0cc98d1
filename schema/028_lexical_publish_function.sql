-- The lexical fold's currentness decision and its append, in one statement
-- (projectors/currentness.py, publish). It takes the journal lock first; each statement
-- below then reads with a snapshot taken under it (READ COMMITTED, a volatile function),
-- so no withdrawal the materializer commits can fall between the decision and the events.
-- The lock is thus never held while the fold's process (a niced one) prepares what comes
-- next: every other append, the API's included, would wait behind it.
--
-- Each candidate event has a condition: p_if_withdrawn null (always appended), or whether
-- its Record, by source identity (the event's org, p_source_corpus_ids, p_namespaces,
-- p_record_keys), must be withdrawn for it to be appended; they keep their order.
-- p_ready_* are the Versions that become their Records' current ones unless withdrawn.
CREATE FUNCTION lexical_publish(
    p_ready_record_ids text[], p_ready_version_ids text[], p_ready_org_ids text[],
    p_ready_corpus_ids text[], p_ready_namespaces text[], p_ready_record_keys text[],
    p_event_ids text[], p_kinds text[], p_public boolean[], p_org_ids text[], p_corpus_ids text[],
    p_subject_types text[], p_subject_ids text[], p_version_ids text[], p_receipt_ids text[],
    p_payloads jsonb[], p_if_withdrawn boolean[], p_source_corpus_ids text[], p_namespaces text[],
    p_record_keys text[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    event_ids text[]; kinds text[]; public boolean[]; org_ids text[]; corpus_ids text[];
    subject_types text[]; subject_ids text[]; version_ids text[]; receipt_ids text[]; payloads jsonb[];
BEGIN
    PERFORM pg_advisory_xact_lock(457136501358);  -- the journal lock (004_journal_append_function.sql)

    INSERT INTO lexical_currentness (record_id, version_id, retired)
    SELECT k.record_id, k.version_id, false
    FROM unnest(p_ready_record_ids, p_ready_version_ids, p_ready_org_ids, p_ready_corpus_ids,
                p_ready_namespaces, p_ready_record_keys) AS k(record_id, version_id, o, c, n, r)
    WHERE NOT EXISTS (SELECT 1 FROM materializer_identities m WHERE m.org_id = k.o AND m.corpus_id = k.c
                      AND m.namespace = k.n AND m.record_key = k.r AND m.withdrawn)
    ON CONFLICT (record_id) DO UPDATE SET version_id = EXCLUDED.version_id, retired = false;

    SELECT array_agg(k.event_id ORDER BY k.ord), array_agg(k.kind ORDER BY k.ord),
           array_agg(k.public ORDER BY k.ord), array_agg(k.org_id ORDER BY k.ord),
           array_agg(k.corpus_id ORDER BY k.ord), array_agg(k.subject_type ORDER BY k.ord),
           array_agg(k.subject_id ORDER BY k.ord), array_agg(k.version_id ORDER BY k.ord),
           array_agg(k.receipt_id ORDER BY k.ord), array_agg(k.payload ORDER BY k.ord)
    INTO event_ids, kinds, public, org_ids, corpus_ids, subject_types, subject_ids, version_ids,
         receipt_ids, payloads
    FROM unnest(p_event_ids, p_kinds, p_public, p_org_ids, p_corpus_ids, p_subject_types, p_subject_ids,
                p_version_ids, p_receipt_ids, p_payloads, p_if_withdrawn, p_source_corpus_ids, p_namespaces,
                p_record_keys)
         WITH ORDINALITY AS k(event_id, kind, public, org_id, corpus_id, subject_type, subject_id, version_id,
                              receipt_id, payload, if_withdrawn, c, n, r, ord)
    WHERE k.if_withdrawn IS NULL
       OR k.if_withdrawn = EXISTS (SELECT 1 FROM materializer_identities m WHERE m.org_id = k.org_id
                                   AND m.corpus_id = k.c AND m.namespace = k.n AND m.record_key = k.r
                                   AND m.withdrawn);

    IF event_ids IS NOT NULL THEN
        PERFORM journal_append(event_ids, kinds, public, org_ids, corpus_ids, subject_types, subject_ids,
                               version_ids, receipt_ids, payloads);
    END IF;
END $$;
