"""One Tantivy index per lexical generation, holding every Corpus.

Documents: one per searchable text Part of a Record's newest servable
Version (and, until its successor is current, of the one it replaces), or per
segment of a long Part, for each live projection generation of its Corpus
(the Corpus's retrieval configuration decides the text). Organization,
projection generation and source namespace are indexed raw fields that
every query filters on (with zero score) before the text scores: a search
reads exactly the generation its Corpus is routed to (where that generation
holds every document, the filter is checked on the hits instead). A checkpoint document
records the journal position the last commit contains, so an index knows
how far it got.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import tantivy

from contentsvc.domain.retrieval import IndexTexts
from contentsvc.search import analysis
from contentsvc.search.analysis import cjk_bigrams
from contentsvc.journal.events import RecordAccepted

SEGMENT_CHARS = 4000  # code points per indexed segment of a long Part
CHECKPOINT_ID = "__checkpoint__"
_RAW_FIELDS = ("doc_id", "org_id", "corpus_id", "projection", "record_in_projection", "namespace", "record_id",
               "version_id", "part_key")


@dataclass(frozen=True)
class Layout:
    """Which text fields an index has and with which analyzer: fixed when the index is created."""

    analyzer: str
    text_fields: tuple[str, ...]
    # Each document keeps its segment's text (stored, not indexed), so that a search cuts its
    # excerpts without reading the Versions' manifests: a long Version's is megabytes.
    stores_segments: bool = False

    def schema(self) -> tantivy.Schema:
        b = tantivy.SchemaBuilder()
        for raw in _RAW_FIELDS:
            b.add_text_field(raw, stored=True, tokenizer_name="raw", index_option="basic")
        b.add_unsigned_field("segment_start", stored=True)
        b.add_unsigned_field("position", stored=True)
        for name in self.text_fields:
            b.add_text_field(name, stored=False, tokenizer_name=self.analyzer)
        if self.stores_segments:
            b.add_bytes_field("segment", stored=True, indexed=False)
        return b.build()

    @property
    def outdated(self) -> bool:
        """Whether a replay would change what the index serves: the earlier layouts' analysis or
        missing segment texts (their excerpts read the Versions' texts instead)."""
        return not self.stores_segments

    def texts(self, title: str, body: str, extra: str) -> dict[str, str]:
        """A segment's document texts: one field scores title, Part text and the other search
        fields together (SciFact nDCG@10 0.687 against 0.666 with title and body apart)."""
        if self is not LEGACY:
            return {"text": cjk_bigrams("\n".join(t for t in (title, body, extra) if t))}
        return {"title": title, "body": body, "fields": extra}


CURRENT = Layout(analysis.ANALYZER, ("text",), stores_segments=True)
# Indexes created before the text field named Tantivy's built-in analyzer: the same terms under
# the name of the analyzer registered for them (analysis.EARLIER_ANALYZER), so not outdated.
NAMED_ANALYZER = Layout(analysis.EARLIER_ANALYZER, ("text",), stores_segments=True)
# Indexes created before segments were stored: their excerpts read the Versions' texts.
ONE_FIELD = Layout(analysis.EARLIER_ANALYZER, ("text",))
# Indexes created before the one-field layout: still read and written as they are, with their
# own analyzer (stop words removed, no CJK segmentation), until a replay rebuilds them.
LEGACY = Layout("contentsvc_en", ("title", "body", "fields"))
_LEGACY_STOPWORDS = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
    "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
    "will", "with",
]
SCHEMA = CURRENT.schema()  # the raw fields, the same in every layout, are looked up in this one


class IndexUnavailable(Exception):
    """The generation's files are missing or unreadable."""


def layout_of(path: Path) -> Layout:
    """The layout of the index at `path` (CURRENT for one not created yet)."""
    try:
        fields = {f["name"]: f["options"] for f in json.loads((path / "meta.json").read_bytes())["schema"]}
        analyzer = fields["text"]["indexing"]["tokenizer"] if "text" in fields else None
    except FileNotFoundError:
        return CURRENT
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IndexUnavailable(f"unreadable index metadata at {path}: {exc}") from exc
    if "segment" in fields:
        return CURRENT if analyzer == CURRENT.analyzer else NAMED_ANALYZER
    return ONE_FIELD if "text" in fields else LEGACY


def open_index(path: Path, create: bool = False) -> tuple[tantivy.Index, Layout]:
    if not create and not (path / "meta.json").exists():
        raise IndexUnavailable(f"no index at {path}")
    layout = layout_of(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        index = tantivy.Index(layout.schema(), path=str(path), reuse=True)
    except (ValueError, OSError) as exc:
        raise IndexUnavailable(str(exc)) from exc
    if layout.analyzer != analysis.ANALYZER:  # Tantivy's built-in one is always there
        index.register_tokenizer(layout.analyzer,
                                 analysis.build_analyzer(_LEGACY_STOPWORDS if layout is LEGACY else None))
    return index, layout


@dataclass(frozen=True)
class Segment:
    part_key: str
    start: int  # code point offset of the segment in the Part's text
    text: str


def segments_of(manifest: dict) -> tuple[str, list[Segment]]:
    """The Version's title text, and the segments to index (title Part excluded when others exist)."""
    parts = [p for p in manifest["parts"] if p["content"].get("kind") == "text"]
    title = " ".join(p["content"]["text"] for p in parts if p["role"] == "title")
    bodies = [p for p in parts if p["role"] != "title"] or parts
    out: list[Segment] = []
    for p in bodies:
        text = p["content"]["text"]
        start = 0
        while True:
            end = _segment_end(text, start)
            out.append(Segment(p["key"], start, text[start:end]))
            if end >= len(text):
                break
            start = end
    return title, out


def segment_at(text: str, start: int) -> str:
    """The indexed segment of a Part's `text` that starts at `start`."""
    return text[start:_segment_end(text, start)]


def _segment_end(text: str, start: int) -> int:
    """Where the segment from `start` ends: at most SEGMENT_CHARS code points, cut after a
    whitespace so that no word is split between two segments (it would be found in neither).
    A hard cut only when the second half of the window holds no whitespace at all."""
    end = start + SEGMENT_CHARS
    if end >= len(text) or text[end - 1].isspace() or text[end].isspace():
        return min(end, len(text))
    for i in range(end - 1, start + SEGMENT_CHARS // 2, -1):
        if text[i].isspace():
            return i + 1
    return end


WRITER_HEAP_PER_THREAD = 64_000_000  # bytes of Tantivy's indexing heap for each writer thread


class LexicalWriter:
    """The single writer of one generation (the lexical projector or a replay)."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        self.index, self.layout = open_index(path, create=True)
        self.writer = self.index.writer(heap_size=WRITER_HEAP_PER_THREAD * threads, num_threads=threads)
        # A commit cut short (the process killed between writing a segment's files and meta.json)
        # leaves files no commit names. Replaying the same work reaches the same opstamp, so the
        # next commit would find its file already there (FileAlreadyExists) on every restart.
        self.writer.garbage_collect_files()

    def checkpoint(self) -> int:
        self.index.reload()
        searcher = self.index.searcher()
        hits = searcher.search(tantivy.Query.term_query(SCHEMA, "doc_id", CHECKPOINT_ID), 1).hits
        if not hits:
            return 0
        return searcher.doc(hits[0][1])["position"][0]

    def remove_record(self, record_id: str) -> None:
        """From every projection generation."""
        self.writer.delete_documents_by_term("record_id", record_id)

    def remove_version(self, version_id: str) -> None:
        """From every projection generation."""
        self.writer.delete_documents_by_term("version_id", version_id)

    def replaced_versions(self, current: dict[str, str]) -> set[str]:
        """Versions of these Records (record_id -> its current Version) other than the current
        one that have documents in the last commit. One reload and one query for all (the
        projector asks after every batch), which reads stored fields only of what it finds: a
        Record new to the index, the usual case, has none (docs/decisions.md, the lexical fold's
        retirement)."""
        self.index.reload()
        searcher = self.index.searcher()
        query = tantivy.Query.boolean_query([
            (tantivy.Occur.Must, tantivy.Query.term_set_query(SCHEMA, "record_id", list(current))),
            (tantivy.Occur.MustNot, tantivy.Query.term_set_query(SCHEMA, "version_id", list(current.values()))),
        ])
        count = searcher.search(query, 1, count=True).count
        if not count:
            return set()
        return {searcher.doc(address)["version_id"][0] for _, address in searcher.search(query, count).hits}

    def remove_record_in(self, projection: str, record_id: str) -> None:
        self.writer.delete_documents_by_term("record_in_projection", f"{projection}/{record_id}")

    def remove_projection(self, projection: str) -> None:
        self.writer.delete_documents_by_term("projection", projection)

    def add_version(self, org_id: str, projection: str, retrieval: dict, version: RecordAccepted) -> None:
        """Index a Version (its record.accepted payload) into one projection generation."""
        texts = IndexTexts(retrieval, version)
        source = version.source
        record_id, version_id = version.record_id, version.version_id
        _, segments = segments_of(version.manifest)
        for i, seg in enumerate(segments):
            self.writer.add_document(tantivy.Document(
                doc_id=f"{projection}/{version_id}/{seg.part_key}/{seg.start}",
                org_id=org_id, corpus_id=source.corpus_id, projection=projection,
                record_in_projection=f"{projection}/{record_id}", namespace=source.namespace,
                record_id=record_id, version_id=version_id, part_key=seg.part_key, segment_start=seg.start,
                **self.layout.texts(texts.title, seg.text if texts.parts_searched else "",
                                    texts.extra if i == 0 else ""),  # other search fields: once per Version
                **({"segment": seg.text.encode()} if self.layout.stores_segments else {}),
            ))

    def commit(self, position: int) -> None:
        """Commit everything added so far together with the journal position it reflects."""
        self.writer.delete_documents_by_term("doc_id", CHECKPOINT_ID)
        self.writer.add_document(tantivy.Document(doc_id=CHECKPOINT_ID, position=position))
        self.writer.commit()

    def close(self) -> None:
        self.writer.wait_merging_threads()


@dataclass(frozen=True)
class Candidate:
    version_id: str
    record_id: str
    part_key: str
    segment_start: int
    score: float
    text: str | None = None  # the segment's text, where the index stores it


_QUERY_SYNTAX = re.compile(r"[^\w\s]+", re.UNICODE)


def _terms_query(index: tantivy.Index, layout: Layout, query_text: str) -> tantivy.Query | None:
    # Texts are indexed NFC-normalized (as ingestion stores them), so the query is too. Words are
    # lowercased before they reach the query parser: AND, OR, NOT and IN typed in a natural query
    # are words to search, not operators (the analyzer lowercases anyway, so scores are unchanged).
    text = unicodedata.normalize("NFC", query_text).lower()
    if layout is not LEGACY:
        text = cjk_bigrams(text)
    words = _QUERY_SYNTAX.sub(" ", text).split()
    if not words:
        return None
    return index.parse_query(" ".join(words), list(layout.text_fields))


def _any_of(field: str, values: list[str]) -> tantivy.Query:
    # A disjunction of term queries, not term_set_query: as the filter beside the scored terms,
    # term_set_query made a SciFact search take 489 us against 245 (the text query alone: 144).
    terms = [tantivy.Query.term_query(SCHEMA, field, value) for value in values]
    return terms[0] if len(terms) == 1 else tantivy.Query.boolean_query([(tantivy.Occur.Should, t) for t in terms])


def search(index: tantivy.Index, layout: Layout, org_id: str, projections: list[str], query_text: str,
           versions: int, namespaces: list[str] | None = None, *, alone: bool = False) -> list[Candidate]:
    """BM25 candidates within the Organization and the Corpora's routed projection generations
    (filters score zero), best first, until they hold `versions` distinct Versions (fewer when
    fewer match): a stored document is read (about 20 us) only for a segment that may be shown.

    `alone`: the projections were found to hold every live document of the index
    (holds_everything). The text query then runs without the filters, which cost Tantivy its
    block-max pruning (a SciFact search: 174 us without them, 331 with them), and every hit read
    is checked to lie in the projections; one that does not (the index moved on since) sends the
    search through the filters after all. The hits are the filtered search's either way: the
    filters score nothing, and the best hits of all documents, when all lie in the projections,
    are the projections' best hits."""
    text = _terms_query(index, layout, query_text)
    if text is None:
        return []
    searcher = index.searcher()
    if alone and not namespaces:
        found = _candidates(searcher, layout, text, versions, projections)
        if found is not None:
            return found
    filters = [tantivy.Query.term_query(SCHEMA, "org_id", org_id), _any_of("projection", projections)]
    if namespaces:
        filters.append(_any_of("namespace", namespaces))
    clauses = [(tantivy.Occur.Must, text)] + [
        (tantivy.Occur.Must, tantivy.Query.const_score_query(f, 0.0)) for f in filters
    ]
    return _candidates(searcher, layout, tantivy.Query.boolean_query(clauses), versions)


def _candidates(searcher: tantivy.Searcher, layout: Layout, query: tantivy.Query, versions: int,
                projections: list[str] | None = None) -> list[Candidate] | None:
    """The best hits of `query` until they hold `versions` Versions; None when `projections`
    are given and a hit read lies outside them."""
    wanted = 2 * versions  # hits asked of Tantivy: a long Version's segments share one page
    while True:
        hits = searcher.search(query, wanted, count=False).hits
        out, seen = [], set()
        for score, address in hits:
            doc = searcher.doc(address)
            first = doc.get_first  # a value, not a list made of it: half the time of doc[field][0]
            if projections is not None and first("projection") not in projections:
                return None
            out.append(Candidate(first("version_id"), first("record_id"), first("part_key"),
                                 first("segment_start"), score,
                                 first("segment").decode() if layout.stores_segments else None))
            seen.add(out[-1].version_id)
            if len(seen) == versions:
                return out
        if len(hits) < wanted:
            return out  # every match read
        wanted *= 4


def holds_everything(index: tantivy.Index, projections: list[str]) -> bool:
    """Whether every live document of the index (but the checkpoint) lies in `projections`:
    one Corpus, or all of them, searched in an index of one Organization. Counting the others
    visits every document (75 us for SciFact's 5,200), so callers keep the answer while the
    index does not change."""
    outside = tantivy.Query.boolean_query([
        (tantivy.Occur.Must, tantivy.Query.all_query()),
        (tantivy.Occur.MustNot, _any_of("projection", projections)),
        (tantivy.Occur.MustNot, tantivy.Query.term_query(SCHEMA, "doc_id", CHECKPOINT_ID)),
    ])
    return index.searcher().search(outside, 1, count=True).count == 0


def term_weights(index: tantivy.Index, layout: Layout, terms: frozenset[str]) -> dict[str, float]:
    """Each analyzed query term's inverse document frequency in the index, as BM25 weighs it (the
    excerpt's window prefers the rarer terms). About 2 us a term."""
    searcher = index.searcher()
    documents = searcher.num_docs
    weights = {}
    for term in terms:
        # Deleted documents count in doc_freq until a merge drops them, not in num_docs.
        found = min(documents, max(searcher.doc_freq(field, term) for field in layout.text_fields))
        weights[term] = math.log(1 + (documents - found + 0.5) / (found + 0.5))
    return weights


def stored_segments(index: tantivy.Index, layout: Layout,
                    wanted: list[tuple[str, str, str, int]]) -> dict[tuple[str, str, str, int], str]:
    """The stored texts of segments, by (projection, version_id, part_key, segment_start): those
    of the hits another retriever found. A segment the index does not hold is left out."""
    if not layout.stores_segments or not wanted:
        return {}
    doc_ids = {f"{projection}/{version_id}/{part_key}/{start}": (projection, version_id, part_key, start)
               for projection, version_id, part_key, start in wanted}
    searcher = index.searcher()
    found = {}
    for _, address in searcher.search(_any_of("doc_id", list(doc_ids)), len(doc_ids), count=False).hits:
        doc = searcher.doc(address)
        found[doc_ids[doc["doc_id"][0]]] = doc["segment"][0].decode()
    return found
