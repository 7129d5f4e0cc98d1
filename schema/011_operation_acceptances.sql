-- Acceptances of Operations (operation.changed carrying its request), per Corpus in
-- journal order: a rerun of a retrieval configuration looks up the configuration
-- accepted last without reading the Corpus's record events.
CREATE INDEX journal_operation_acceptances ON journal (org_id, corpus_id, position DESC)
    WHERE kind = 'operation.changed' AND payload ? 'request';
