-- API processes cache what a search reads before it ranks (search/corpus_routes.py): each
-- Corpus's vector spaces and routed projection generation, and the serving lexical generation.
-- Any change to them is announced on contentsvc_search_routes and every cache drops what it
-- holds. Statement triggers, so that every path is covered: Corpora change rarely, and a
-- generation's state only at creation, cutover and retirement (not at each lexical commit,
-- which moves only its `announced` column).
CREATE FUNCTION search_routes_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('contentsvc_search_routes', TG_TABLE_NAME);
    RETURN NULL;
END;
$$;

CREATE TRIGGER corpora_search_routes_changed AFTER INSERT OR UPDATE OR DELETE ON corpora
    FOR EACH STATEMENT EXECUTE FUNCTION search_routes_changed();

CREATE TRIGGER search_generations_routes_changed AFTER INSERT OR DELETE OR UPDATE OF state ON search_generations
    FOR EACH STATEMENT EXECUTE FUNCTION search_routes_changed();
