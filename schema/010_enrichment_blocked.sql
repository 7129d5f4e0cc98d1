-- A Version whose enrichment needs an operator (the embedding model is missing): the
-- Diagnostic of its latest record.enrichment_blocked, until record.enriched clears it.
ALTER TABLE versions ADD COLUMN enrichment_blocked jsonb;
