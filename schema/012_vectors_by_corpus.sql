-- Semantic search reads the labels a search may rank (its Organization, Corpora
-- and namespace filter, current Versions only) before it ranks anything: an
-- index by scope, carrying what the join to the current Versions needs, so the
-- read is one index scan per Corpus instead of a scan of every stored vector.
CREATE INDEX vectors_by_corpus ON vectors (org_id, corpus_id, space) INCLUDE (label, version_id, record_id);
