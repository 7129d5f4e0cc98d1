-- A Corpus that gained the engine's vector space (a rebuild after the space was
-- enabled) has its current Versions embedded by the vectors projector, a chunk
-- per step. One row per Corpus still to fill; `since` is the position of the
-- corpus.retrieval_changed that added the space (the read model must have
-- folded it before the fill can know it is complete).
CREATE TABLE vector_backfills (
    org_id     text NOT NULL,
    corpus_id  text NOT NULL,
    space      text NOT NULL,
    since      bigint NOT NULL,
    PRIMARY KEY (org_id, corpus_id, space)
);
