"""The first-party `query` subscription evaluator (decisions-part2, "Plugin processes and
first-party plugins").

Per request and selection of Parts one in-memory Tantivy index with the core's lexical analyzer
(the same stemming and stop words a search uses), shared by the request's expressions that select
the same Parts: one document per selected text Part and one whole-Version document holding every
selected Part's text. An expression matches iff the whole-Version
document matches its query (parsed with `default_operator`); the evidence names the
selected Parts matching the OR of the query's terms, in manifest order, and a snippet of
the first of them in code points.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import tantivy
from jsonschema import Draft202012Validator

from contentsvc.search.excerpts import excerpt, query_terms
from contentsvc.search.analysis import ANALYZER, cjk_bigrams
from contentsvc_plugins.server import Plugin, evaluation_batch, terminal

FOLDER = Path(__file__).resolve().parent
MAX_PART_KEYS = 100  # part 2: evidence part_keys at most 100
DEFAULT_SNIPPET_CHARS = 200
WRITER_HEAP_BYTES = 15_000_000  # Tantivy's minimum; the index lives for one request
WHOLE, PART = "version", "part"
VALID_CACHE_SIZE = 10_000  # expressions and configurations known valid (the same ones come with every Version)
# A word the query excludes (`-word`) is not one of the terms a Part is credited for.
_NEGATED = re.compile(r"(?:^|\s)-\S+")


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("kind", stored=True, tokenizer_name="raw", index_option="basic")
    builder.add_unsigned_field("ordinal", stored=True)
    builder.add_text_field("text", stored=False, tokenizer_name=ANALYZER)
    return builder.build()


SCHEMA = _schema()


def build() -> Plugin:
    plugin = Plugin(folder=FOLDER, handlers={})
    subscription = plugin.pinned.manifest.contributions.subscription
    evaluator = QueryEvaluator(Draft202012Validator(subscription.expression_schema),
                               Draft202012Validator(subscription.configuration_schema), subscription.max_batch_size)
    plugin.handlers["subscription"] = evaluator.evaluate
    return plugin


class QueryEvaluator:
    def __init__(self, expressions: Draft202012Validator, configurations: Draft202012Validator,
                 max_batch_size: int):
        self.expressions = expressions
        self.configurations = configurations
        self.max_batch_size = max_batch_size
        self._valid: set[str] = set()  # canonical JSON of (expression, configuration) pairs that passed

    def evaluate(self, request: dict) -> dict:
        _, evaluations, parts = evaluation_batch(request, self.max_batch_size)
        parts = [part for part in parts if isinstance(part.get("key"), str) and isinstance(part.get("text"), str)]
        indexes: dict[tuple[int, ...], VersionIndex] = {}  # one per selection of Parts, for this request
        return {"decisions": [self._decide(n, evaluation, parts, indexes) for n, evaluation in enumerate(evaluations)]}

    def _decide(self, n: int, evaluation: object, parts: list[dict], indexes: dict) -> dict:
        if not isinstance(evaluation, dict) or not isinstance(evaluation.get("id"), str):
            raise terminal("invalid_request", f"evaluations/{n} needs an id", 400)
        expression = evaluation.get("expression")
        configuration = evaluation.get("configuration") or {}
        # Validation is pure: a pair that passed once passes again (schema checks cost more than a search).
        known = json.dumps([expression, configuration], sort_keys=True, separators=(",", ":"))
        if known not in self._valid:
            error = next(iter(self.expressions.iter_errors(expression)), None)
            if error is not None:
                raise terminal("invalid_expression", f"evaluations/{n}/expression: {error.message}")
            error = next(iter(self.configurations.iter_errors(configuration)), None)
            if error is not None:
                raise terminal("invalid_configuration", f"evaluations/{n}/configuration: {error.message}")
            if len(self._valid) >= VALID_CACHE_SIZE:
                self._valid.clear()
            self._valid.add(known)
        decision = decide(expression, parts, configuration.get("snippet_chars", DEFAULT_SNIPPET_CHARS), indexes)
        return {"id": evaluation["id"], **decision}


def selection(expression: dict, parts: list[dict]) -> tuple[int, ...]:
    """The positions of the Parts the expression's `roles` and `part_keys` select."""
    roles, keys = expression.get("roles"), expression.get("part_keys")
    return tuple(n for n, part in enumerate(parts)
                 if (roles is None or part.get("role") in roles) and (keys is None or part["key"] in keys))


class VersionIndex:
    """The in-memory index of one selection of a Version's Parts (built once per request and
    selection: the expressions of a request share it, and the BM25 statistics are the same as an
    index built for one expression alone)."""

    def __init__(self, selected: list[dict]) -> None:
        self.selected = selected
        self.texts = [unicodedata.normalize("NFC", part["text"]) for part in selected]
        self.index = tantivy.Index(SCHEMA)  # in memory: nothing outlives the request
        if self.texts:
            writer = self.index.writer(WRITER_HEAP_BYTES, 1)
            analysed = [cjk_bigrams(text) for text in self.texts]
            for ordinal, text in enumerate(analysed):
                writer.add_document(tantivy.Document(kind=PART, ordinal=ordinal, text=text))
            writer.add_document(tantivy.Document(kind=WHOLE, ordinal=len(analysed), text="\n".join(analysed)))
            writer.commit()
            writer.wait_merging_threads()
            self.index.reload()
        self.searcher = self.index.searcher()


def decide(expression: dict, parts: list[dict], snippet_chars: int,
           indexes: dict[tuple[int, ...], VersionIndex] | None = None) -> dict:
    """One expression against one Version's text Parts: `{decision, evidence?}`. `indexes` keeps the
    request's indexes by selection (the selected Parts' positions), so each is built once."""
    key = selection(expression, parts)
    selected = [parts[n] for n in key]
    if indexes is None:
        indexes = {}
    built = indexes.get(key)
    if built is None:
        built = indexes[key] = VersionIndex(selected)
    conjunction = expression.get("default_operator", "AND") == "AND"
    query_text = cjk_bigrams(unicodedata.normalize("NFC", expression["query"]))  # as ingestion stores texts
    try:
        whole_query = built.index.parse_query(query_text, ["text"], conjunction_by_default=conjunction)
    except ValueError as exc:
        raise terminal("invalid_expression", f"the query cannot be parsed: {exc}") from None
    if not selected:
        return {"decision": "no_match"}  # decisions-part2: no selected Part is no_match
    texts, searcher = built.texts, built.searcher

    whole = _restricted(whole_query, WHOLE)
    hits = searcher.search(whole, 1).hits
    if not hits:
        return {"decision": "no_match"}
    score = hits[0][0]

    terms = query_terms(_NEGATED.sub(" ", query_text))
    matching: list[int] = []
    if terms:
        any_term = tantivy.Query.boolean_query(
            [(tantivy.Occur.Should, tantivy.Query.term_query(SCHEMA, "text", term)) for term in sorted(terms)])
        found = searcher.search(_restricted(any_term, PART), len(texts)).hits
        matching = sorted(searcher.doc(address)["ordinal"][0] for _, address in found)
    part_keys = [selected[ordinal]["key"] for ordinal in matching][:MAX_PART_KEYS]
    details: dict = {"score": round(float(score), 6)}
    if matching:
        first = matching[0]
        start, end = excerpt(texts[first], terms, window=snippet_chars)
        details["snippet"] = {"part_key": selected[first]["key"], "text": texts[first][start:end],
                              "start": start, "end": end}
    return {"decision": "match", "evidence": {"explanation": f"query matched {len(part_keys)} part(s)",
                                              "part_keys": part_keys, "details": details}}


def _restricted(query: tantivy.Query, kind: str) -> tantivy.Query:
    return tantivy.Query.boolean_query([
        (tantivy.Occur.Must, query),
        (tantivy.Occur.Must, tantivy.Query.const_score_query(tantivy.Query.term_query(SCHEMA, "kind", kind), 0.0)),
    ])
