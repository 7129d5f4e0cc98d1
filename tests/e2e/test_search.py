"""Lexical search over real HTTP against a real `contentsvc run` with real Tantivy files.

Covers part 1 rules 20 (searchRecords) and 21 (listSearchProfiles), the
"Agent-tool result shapes" (search hit and result), the search Limits and
Errors, and decisions.md "Search" (request and profile shapes, code-point
excerpts, currentness and authorization at search time), "Records"
(withdrawal leaves search at once) and "Resolved ambiguities" (scope).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import time
import unicodedata
import uuid

import httpx
import psycopg
import pytest

from contentsvc.auth import keys
from contentsvc.auth.principal import Principal
from contentsvc.domain.models import SearchRequest
from contentsvc.search import lexical_index
from contentsvc.search import service as search_service
from tests.conftest import ServerProcess, assert_error, client_for, create_corpus, text_command, wait_resolved

# Own servers whose new Corpora get no engine vector space: search there is lexical in every mode.
LEXICAL_ONLY = {"CONTENTSVC_ENGINE_VECTORS": "0"}
HIT_MEMBERS = {"rank", "record_id", "version_id", "part_key", "excerpt", "explanation"}


# ----------------------------------------------------------------- helpers


def _cid(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _token(prefix: str = "tok") -> str:
    """A word no other test uses; ends in digits so that stemming leaves it alone."""
    return f"{prefix}{uuid.uuid4().hex[:8]}q{uuid.uuid4().int % 10_000:04d}"


def ingest(client: httpx.Client, cmd: dict) -> str:
    r = client.post("/v0/records", json=cmd)
    assert r.status_code == 202, r.text
    return r.json()["receipt_id"]


def ingest_batch(client: httpx.Client, cmds: list[dict]) -> list[str]:
    r = client.post("/v0/records/batch", json={"entries": cmds})
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert all(item["status"] == 202 for item in items), items
    return [item["receipt"]["receipt_id"] for item in items]


def wait_searchable(client: httpx.Client, receipt_id: str, timeout: float = 40.0) -> dict:
    """Polls the Receipt until `availability.searchable` (part1 "Agent tool server": text is
    searchable only when availability.searchable is true)."""
    deadline = time.time() + timeout
    receipt: dict = {}
    while time.time() < deadline:
        r = client.get(f"/v0/ingestion-receipts/{receipt_id}")
        assert r.status_code == 200, r.text
        receipt = r.json()
        assert receipt.get("outcome") != "conflict", receipt
        availability = receipt.get("availability") or {}
        assert availability.get("state") != "quarantined", receipt
        if availability.get("searchable"):
            return receipt
        time.sleep(0.05)
    raise AssertionError(f"receipt {receipt_id} never became searchable: {receipt}")


def search_raw(client: httpx.Client, query: str, corpus_ids: list[str], mode: str | None = "lexical",
               **extra) -> httpx.Response:
    """POST /v0/search; lexical unless told (mode=None sends no mode: the server default, hybrid)."""
    body = {"query": query, "corpus_ids": corpus_ids, **extra}
    if mode is not None:
        body["mode"] = mode
    return client.post("/v0/search", json=body)


def search(client: httpx.Client, query: str, corpus_ids: list[str], mode: str | None = "lexical", **extra) -> dict:
    r = search_raw(client, query, corpus_ids, mode, **extra)
    assert r.status_code == 200, r.text
    body = r.json()
    assert_search_shape(body)
    return body


def assert_search_shape(body: dict) -> None:
    # part1 "Agent-tool result shapes"; decisions.md Search: {items: [hit], retrieval_profile: {name, version}}.
    assert set(body) == {"items", "retrieval_profile"}, body
    assert set(body["retrieval_profile"]) == {"name", "version"}
    assert body["retrieval_profile"]["name"] == "default"
    assert isinstance(body["retrieval_profile"]["version"], str) and body["retrieval_profile"]["version"]
    assert [hit["rank"] for hit in body["items"]] == list(range(1, len(body["items"]) + 1))
    for hit in body["items"]:
        assert set(hit) <= HIT_MEMBERS and HIT_MEMBERS - {"explanation"} <= set(hit), hit
        assert set(hit["excerpt"]) == {"text", "start", "end"}
        assert 0 <= hit["excerpt"]["start"] <= hit["excerpt"]["end"]
        if "explanation" in hit:
            assert set(hit["explanation"]) <= {"lexical_rank", "semantic_rank", "score"}
            assert isinstance(hit["explanation"]["score"], (int, float))


_versions: dict[tuple[str, str], dict] = {}


def get_version(client: httpx.Client, record_id: str, version_id: str) -> dict:
    key = (record_id, version_id)
    if key not in _versions:  # Versions are immutable: reading one once is enough
        r = client.get(f"/v0/records/{record_id}/versions/{version_id}")
        assert r.status_code == 200, r.text
        _versions[key] = r.json()
    return _versions[key]


def part_text(client: httpx.Client, hit: dict) -> str:
    version = get_version(client, hit["record_id"], hit["version_id"])
    [part] = [p for p in version["manifest"]["parts"] if p["key"] == hit["part_key"]]
    return part["content"]["text"]


def assert_excerpt_exact(client: httpx.Client, hit: dict, must_contain: str | None = None) -> str:
    """decisions.md Search: `excerpt.text == part_text[start:end]` in code points (Python indexing)."""
    text = part_text(client, hit)
    ex = hit["excerpt"]
    assert ex["end"] <= len(text), (ex, len(text))
    assert ex["text"] == text[ex["start"]:ex["end"]], (ex, text[ex["start"]:ex["end"]])
    assert ex["text"], hit
    if must_contain is not None:
        assert must_contain.casefold() in ex["text"].casefold(), (must_contain, ex)
    return text


def record_ids(body: dict) -> list[str]:
    return [hit["record_id"] for hit in body["items"]]


def cited(body: dict) -> list[tuple]:
    """What a hit cites, without its score."""
    return [(hit["rank"], hit["record_id"], hit["version_id"], hit["part_key"], hit["excerpt"]["text"],
             hit["excerpt"]["start"], hit["excerpt"]["end"]) for hit in body["items"]]


def only(body: dict) -> dict:
    assert len(body["items"]) == 1, body
    return body["items"][0]


# ----------------------------------------------------------------- finding and citing


def test_search_finds_record_and_cites_exact_code_point_excerpts(api):
    # part1 rule 20 + "Agent-tool result shapes"; decisions.md Search (code-point excerpts).
    corpus = create_corpus(api, _cid())
    tok = _token()
    accents = f"Le café 😀 servait une crème brûlée 🍮 parfaite à Zürich, señor. 東京タワー 夜景 🌃 {tok} fin 👍🏽."
    nfd = "Cafe\u0301 de\u0301ja\u0300 vu: un re\u0301sume\u0301 nai\u0308f 🎉 pour Ångström."
    manifest = {"kind": "manifest", "parts": [
        {"key": "title", "role": "title", "content": {"kind": "text", "text": "Un titre sans rapport"}},
        {"key": "intro", "role": "body", "content": {"kind": "text", "text": "Rien à voir ici, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢."}},
        {"key": "details", "role": "body", "content": {"kind": "text", "text": accents}},
    ]}
    r1 = ingest(api, {"idempotency_key": uuid.uuid4().hex,
                      "source": {"corpus_id": corpus, "namespace": "test", "record_key": "accents"},
                      "content": manifest})
    r2 = ingest(api, text_command(corpus, "combining", nfd))
    rec1, rec2 = wait_searchable(api, r1), wait_searchable(api, r2)

    for query in (tok, "brûlée", "BRÛLÉE", "Zürich", "東京タワー", "señor"):
        hit = only(search(api, query, [corpus], mode="lexical"))
        assert (hit["record_id"], hit["version_id"], hit["part_key"]) == (rec1["record_id"], rec1["version_id"],
                                                                          "details"), (query, hit)
        text = assert_excerpt_exact(api, hit, must_contain=query)
        # The whole short Part, counted in code points: astral emoji count once (not twice as in
        # UTF-16, not four times as in UTF-8).
        assert (hit["excerpt"]["start"], hit["excerpt"]["end"]) == (0, len(text)) == (0, len(accents))

    # NFC composes the combining marks: the Version holds the composed text, and the excerpt
    # slices that text. The query matches whether typed composed or decomposed.
    composed = unicodedata.normalize("NFC", nfd)
    assert composed != nfd and len(composed) < len(nfd)
    for query in ("résumé", "re\u0301sume\u0301", "déjà", "Ångström", "naïf"):
        hit = only(search(api, query, [corpus], mode="lexical"))
        assert (hit["record_id"], hit["version_id"], hit["part_key"]) == (rec2["record_id"], rec2["version_id"],
                                                                          "body"), (query, hit)
        text = assert_excerpt_exact(api, hit, must_contain=unicodedata.normalize("NFC", query))
        assert text == composed and "\u0301" not in text
        assert hit["excerpt"]["end"] == len(composed)

    # Hybrid is the default and returns the lexical hits (fused with semantic ones when the Corpus
    # has a vector space); every hit, lexical or not, cites an exact excerpt.
    for query in (tok, "brûlée"):
        for mode in (None, "hybrid"):
            body = search(api, query, [corpus], mode=mode)
            [lexical] = [hit for hit in body["items"] if hit.get("explanation", {}).get("lexical_rank") == 1]
            assert (lexical["record_id"], lexical["version_id"], lexical["part_key"]) == (
                rec1["record_id"], rec1["version_id"], "details")
            for hit in body["items"]:
                assert hit["record_id"] in (rec1["record_id"], rec2["record_id"])
                assert_excerpt_exact(api, hit)


def _filler(length: int, seed: str = "") -> str:
    unit = f"señor 😀 東京 naïve{seed} 🏳️‍🌈 crème "
    return (unit * (length // len(unit) + 1))[:length]


def test_long_part_excerpt_window_and_later_segment(api):
    # part1 "Agent-tool result shapes" (offsets in code points into the Part's text);
    # decisions.md Search (text == part_text[start:end]); rule 20 (lexical candidates).
    corpus = create_corpus(api, _cid())
    near_boundary, far, last = _token("edge"), _token("far"), _token("last")
    # A word that straddles code point 4,000 (where a 4,000-character segment would end),
    # one far into the Part (~9,500), one at its very end. Emoji and CJK everywhere before them.
    head = _filler(3994) + " "
    text = head + near_boundary + " " + _filler(9500 - len(head) - len(near_boundary) - 1) + " " + far + " "
    text += _filler(11_000 - len(text)) + " " + last
    assert text.index(near_boundary) < 4000 < text.index(near_boundary) + len(near_boundary)
    assert 9400 < text.index(far) < 9600 and len(text) > 11_000
    assert unicodedata.normalize("NFC", text) == text
    receipt = wait_searchable(api, ingest(api, text_command(corpus, "long", text)))

    for term, low in ((far, 8000), (last, 10_000), (near_boundary, 3000)):
        hit = only(search(api, term, [corpus], mode="lexical"))
        assert (hit["record_id"], hit["version_id"], hit["part_key"]) == (receipt["record_id"], receipt["version_id"],
                                                                          "body")
        stored = assert_excerpt_exact(api, hit, must_contain=term)
        assert stored == text
        ex = hit["excerpt"]
        # A window around the match, not the whole Part and not from 0.
        assert low < ex["start"] <= text.index(term) < text.index(term) + len(term) <= ex["end"], (term, ex)
        assert ex["end"] - ex["start"] <= 1000


def test_an_excerpt_shows_the_rarer_query_words(api):
    # decisions.md Search (excerpts): the window whose distinct query words weigh most, each its
    # inverse document frequency in the lexical index, wins. Counted alone, the first window's
    # "the", "role", "of" and "in" would beat the two rare words further on.
    corpus = create_corpus(api, _cid())
    rare, rarer = _token("mito"), _token("apo")
    common = "the role of the cell in the study of the tissue "
    others = ingest_batch(api, [text_command(corpus, f"common{i}", common * 3) for i in range(20)])
    text = common * 6 + "filler words here " * 30 + f"{rare} drives {rarer} " + "filler words here " * 30
    receipt = wait_searchable(api, ingest(api, text_command(corpus, "long", text)))
    for receipt_id in others:
        wait_searchable(api, receipt_id)

    # Every hit of the Corpus (21): where the long Record ranks among the short ones depends on the
    # statistics of the whole index, which the other tests on this server fill (it ranked 1st or
    # 21st); its excerpt is what is checked here.
    hits = search(api, f"the role of {rare} in the {rarer}", [corpus], limit=50)["items"]
    assert len(hits) == 21
    hit = next(h for h in hits if h["record_id"] == receipt["record_id"])
    assert f"{rare} drives {rarer}" in hit["excerpt"]["text"], hit["excerpt"]
    assert assert_excerpt_exact(api, hit, must_contain=rare) == text


def test_limit_and_ranks(api):
    # part1 Limits (50 results), "Agent-tool result shapes" (rank), decisions.md Search (limit default 10).
    corpus = create_corpus(api, _cid())
    tok = _token()
    receipts = ingest_batch(api, [
        text_command(corpus, f"r{i}", " ".join([tok] * (i + 1) + ["padding words"] * 3)) for i in range(12)
    ])
    wait_searchable(api, receipts[-1])
    for receipt in receipts:
        wait_searchable(api, receipt)
    assert len(search(api, tok, [corpus])["items"]) == 10
    five = search(api, tok, [corpus], limit=5)
    assert len(five["items"]) == 5 and len(set(record_ids(five))) == 5
    assert len(search(api, tok, [corpus], limit=1)["items"]) == 1
    everything = search(api, tok, [corpus], limit=50)
    assert len(everything["items"]) == 12 and len(set(record_ids(everything))) == 12
    scores = [hit["explanation"]["score"] for hit in everything["items"]]
    assert scores == sorted(scores, reverse=True)
    assert record_ids(everything)[:5] == record_ids(five)


def test_hydration_reads_texts_only_for_the_page_and_fills_a_deeper_hit(api, database_url, org):
    # part 1 rule 20: every hit re-read and re-authorized; decisions.md Search (hydration): the
    # manifests of the first `texts` authorized candidates, the rest read when a hit needs them.
    corpus = create_corpus(api, _cid())
    tok = _token()
    receipts = ingest_batch(api, [text_command(corpus, f"h{i}", f"{tok} text number {i}") for i in range(3)])
    versions = [wait_searchable(api, receipt)["version_id"] for receipt in receipts]

    async def hydrate():
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            ranked = ["ver_not_a_version", *reversed(versions)]  # best first; an unknown id is skipped
            hydrated = await search_service._hydrate(conn, org, [corpus], ranked, None, texts=1)
            before = {v: hydrated[v].parts for v in hydrated}
            await search_service._fill_texts(conn, hydrated, versions)
            return before, {v: hydrated[v].parts for v in hydrated}

    before, after = asyncio.run(hydrate())
    assert set(before) == set(versions)
    assert before[versions[2]] is not None and before[versions[0]] is None and before[versions[1]] is None
    assert [after[v]["body"] for v in versions] == [f"{tok} text number {i}" for i in range(3)]


def test_an_excerpt_without_a_stored_segment_is_cut_from_the_version(api, database_url, org):
    # part1 "Agent-tool result shapes" (text == part_text[start:end]); decisions.md Search
    # (excerpts): a hit whose segment text the lexical index does not hold (an index built
    # before it stored them) has its segment cut from the Version's Part text, read then.
    corpus = create_corpus(api, _cid())
    tok = _token()
    text = _filler(4500) + f" {tok} " + _filler(3000)
    receipt = wait_searchable(api, ingest(api, text_command(corpus, "fallback", text)))
    hit = only(search(api, tok, [corpus], mode="lexical"))
    start = hit["excerpt"]["start"]
    assert start > 0 and text[start:hit["excerpt"]["end"]] == hit["excerpt"]["text"]
    _, indexed = lexical_index.segments_of(
        {"parts": [{"key": "body", "role": "body", "content": {"kind": "text", "text": text}}]})
    segment_start = max(s.start for s in indexed if s.start <= start)  # the hit's segment

    async def cut():
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            hydrated = await search_service._hydrate(conn, org, [corpus], [receipt["version_id"]], None, texts=0)
            page = [search_service.Ranked(receipt["version_id"], receipt["record_id"], "body", segment_start, 1.0)]
            return await search_service._segment_texts(conn, hydrated, page, None, None, {})

    segments = asyncio.run(cut())
    assert segments == {(receipt["version_id"], "body", segment_start): lexical_index.segment_at(text, segment_start)}
    assert tok in segments[receipt["version_id"], "body", segment_start]


def test_a_page_of_stale_candidates_widens_the_search(api, database_url, org):
    # part 1 rule 20: hits are only current, authorized Versions, however far the index is behind;
    # decisions.md Search: a lexical page asks the index for the Versions of limit + 2 candidates,
    # and four times as many again (up to three rounds) while too few of them are current.
    corpus = create_corpus(api, _cid())
    tok = _token()
    receipts = ingest_batch(api, [text_command(corpus, f"w{i}", f"{tok} current {i}") for i in range(12)])
    current = [wait_searchable(api, receipt) for receipt in receipts]
    # Ranked first: 25 Versions the index still holds but the read model no longer serves
    # (replaced or withdrawn since), as between a commit and the lexical fold's catching up.
    ranked = [lexical_index.Candidate(f"ver_stale{i:02d}", f"rec_stale{i:02d}", "body", 0, 9.0) for i in range(25)]
    ranked += [lexical_index.Candidate(r["version_id"], r["record_id"], "body", 0, 1.0 - i / 100)
               for i, r in enumerate(current)]
    asked: list[int] = []

    async def fetch(n: int):
        asked.append(n)
        return ranked[:n]

    async def rank():
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            principal = Principal(key_id="key_test", org_id=org, actions=frozenset({"search:query"}), corpora=None)
            request = SearchRequest(query=tok, corpus_ids=[corpus], mode="lexical", limit=10)
            return await search_service._ranked(conn, principal, request, fetch,
                                                request.limit + search_service.STALE_SLACK, request.limit)

    best, hydrated = asyncio.run(rank())
    assert asked == [12, 48]  # 12 stale candidates, then all 37
    assert [c.version_id for c in best] == [r["version_id"] for r in current]
    assert all(hydrated[c.version_id].parts is not None for c in best[:10])


def test_query_words_are_never_query_syntax(api):
    # part1 rule 20 (errors list: no 500 for a query) and Errors; decisions.md Errors (a 5xx never
    # leaks). issue: uppercase AND/OR/NOT/IN in a natural query reached Tantivy's query parser.
    corpus = create_corpus(api, _cid())
    tok = _token()
    receipt = wait_searchable(api, ingest(api, text_command(corpus, "play", f"Romeo and Juliet {tok} in Verona")))
    for query in (f"Romeo AND Juliet {tok}", f"{tok} OR", f"NOT {tok}", f"IN {tok}", f"{tok} TO",
                  f"[{tok} TO x]", f"title:{tok}", f'"{tok}"', f"{tok}^2", f"-{tok}", f"{tok}*", f"({tok}"):
        hit = only(search(api, query, [corpus]))
        assert hit["record_id"] == receipt["record_id"], query
    for query in ("AND", "IN"):  # words of the text, and no stop words are removed: found
        assert record_ids(search(api, query, [corpus])) == [receipt["record_id"]], query
    for query in ("OR", "NOT", "the", "???", "x" * 60):
        assert search(api, query, [corpus])["items"] == [], query


def test_english_stemming_and_cjk_bigrams(api):
    # issue "Search quality": language-aware analysis by default; docs/decisions.md "Lexical analysis".
    corpus = create_corpus(api, _cid())
    tok = _token()
    english = wait_searchable(api, ingest(api, text_command(
        corpus, "stems", f"The studies {tok} measured running mice and connected neurons")))
    japanese = wait_searchable(api, ingest(api, text_command(corpus, "ja", f"{tok} 東京都に住んでいる研究者")))
    korean = wait_searchable(api, ingest(api, text_command(corpus, "ko", f"{tok} 한국어 형태소 분석기")))
    chinese = wait_searchable(api, ingest(api, text_command(corpus, "zh", f"{tok} 北京大学的研究人员")))
    for query, expected in (("study runs connection", english), ("東京", japanese), ("住んで", japanese),
                            ("형태소", korean), ("北京大学", chinese)):
        hit = only(search(api, query, [corpus]))
        assert hit["record_id"] == expected["record_id"], query
        assert_excerpt_exact(api, hit)
    assert search(api, "京東", [corpus])["items"] == []  # the bigram reversed is another word



# ----------------------------------------------------------------- availability, correction, withdrawal


def test_availability_moves_to_retrieval_ready_and_feed_says_so(api, database_url):
    # part1 "Availability" and "States and transitions"; decisions.md Change feed
    # (record.availability_changed when a Version's availability or searchability moves).
    corpus = create_corpus(api, _cid())
    r = api.get("/v0/changes", params={"corpus_id": corpus})
    assert r.status_code == 200
    cursor = r.json()["next_cursor"]
    tok = _token()
    receipt_id = ingest(api, text_command(corpus, "moves", f"availability {tok}"))

    order = ["materialized", "building_baseline", "retrieval_ready"]
    seen: list[str] = []
    deadline = time.time() + 40
    while True:
        receipt = api.get(f"/v0/ingestion-receipts/{receipt_id}").json()
        availability = receipt.get("availability")
        if availability:
            if not seen or seen[-1] != availability["state"]:
                seen.append(availability["state"])
            # searchable only once retrieval_ready; current from then on, not before (part1 "States and
            # transitions": a Version still building reports is_current false until it becomes current)
            assert availability["searchable"] == (availability["state"] == "retrieval_ready"), receipt
            assert availability["is_current"] == availability["searchable"], receipt
            if availability["searchable"]:
                break
        assert time.time() < deadline, seen
        time.sleep(0.02)
    assert [order.index(s) for s in seen] == sorted(order.index(s) for s in seen), seen  # never backwards
    assert seen[-1] == "retrieval_ready"
    assert only(search(api, tok, [corpus]))["version_id"] == receipt["version_id"]

    # The journal holds each move once, in order.
    with psycopg.connect(database_url) as conn:
        states = [row[0] for row in conn.execute(
            "SELECT payload->>'state' FROM journal WHERE kind = 'record.availability_changed' AND version_id = %s"
            " ORDER BY position", (receipt["version_id"],))]
    assert states == order, states

    # The change feed carries them as record.availability_changed for that Version.
    events: list[dict] = []
    deadline = time.time() + 20
    while len([e for e in events if e["kind"] == "record.availability_changed"]) < 3:
        assert time.time() < deadline, events
        page = api.get("/v0/changes", params={"corpus_id": corpus, "cursor": cursor}).json()
        events += page["items"]
        cursor = page["next_cursor"]
        time.sleep(0.05)
    moved = [e for e in events if e["kind"] == "record.availability_changed"]
    assert all(e["version_id"] == receipt["version_id"] and e["subject"] == {"type": "record",
                                                                             "id": receipt["record_id"]}
               for e in moved), moved
    assert {e.get("receipt_id") for e in moved} == {receipt_id}


def test_correction_replaces_the_old_version_in_hits(api):
    # decisions.md Search: a hit only for the current Version; part1 "Agent tool server" ingest rules.
    corpus = create_corpus(api, _cid())
    tok, old_only = _token(), _token("old")
    first = wait_searchable(api, ingest(api, text_command(corpus, "doc", f"first text {tok} {old_only}")))
    assert only(search(api, tok, [corpus]))["version_id"] == first["version_id"]

    second = wait_searchable(api, ingest(api, text_command(corpus, "doc", f"corrected text {tok}")))
    assert second["record_id"] == first["record_id"] and second["version_id"] != first["version_id"]
    for query in (tok, old_only, f"{tok} {old_only}", "text"):
        for mode in ("lexical", None):
            body = search(api, query, [corpus], mode=mode)
            assert first["version_id"] not in {hit["version_id"] for hit in body["items"]}, (query, body)
    hit = only(search(api, tok, [corpus]))
    assert hit["version_id"] == second["version_id"]
    assert "corrected" in assert_excerpt_exact(api, hit, must_contain=tok)
    assert search(api, old_only, [corpus])["items"] == []
    # The old Receipt now says its Version is no longer current (an agent stop condition).
    old = api.get(f"/v0/ingestion-receipts/{first['receipt_id']}").json()["availability"]
    assert old["is_current"] is False and old["searchable"] is False


def test_withdrawal_leaves_search_at_once(api):
    # decisions.md Records: no searchable hit may cite a withdrawn Record after the withdrawal's
    # receipt resolves (searched immediately, no waiting for the index).
    corpus = create_corpus(api, _cid())
    tok = _token()
    kept = wait_searchable(api, ingest(api, text_command(corpus, "kept", f"{tok} stays")))
    gone = wait_searchable(api, ingest(api, text_command(corpus, "gone", f"{tok} {tok} leaves")))
    assert set(record_ids(search(api, tok, [corpus]))) == {kept["record_id"], gone["record_id"]}

    r = api.post("/v0/records/withdrawals", json={
        "idempotency_key": uuid.uuid4().hex,
        "source": {"corpus_id": corpus, "namespace": "test", "record_key": "gone"}})
    assert r.status_code == 202, r.text
    assert wait_resolved(api, r.json()["receipt_id"])["outcome"] == "withdrawal_applied"
    assert record_ids(search(api, tok, [corpus])) == [kept["record_id"]]
    assert record_ids(search(api, f"{tok} leaves", [corpus], limit=50)) == [kept["record_id"]]
    assert record_ids(search(api, f"{tok} leaves", [corpus], mode=None, limit=50)) == [kept["record_id"]]


# ----------------------------------------------------------------- authorization


def test_other_organizations_records_never_appear(server, make_key, api):
    # part1 Authentication 2-3 and rule 20 (mandatory Organization prefilter); decisions.md Search.
    corpus = create_corpus(api, _cid())
    tok = _token()
    mine = wait_searchable(api, ingest(api, text_command(corpus, "k", f"{tok} mine")))
    other_org = f"org-{uuid.uuid4().hex[:8]}"
    with client_for(server, make_key(other_org)) as other:
        assert create_corpus(other, corpus) == corpus  # the same corpus_id in another Organization
        theirs = wait_searchable(other, ingest(other, text_command(corpus, "k", f"{tok} {tok} theirs")))
        assert record_ids(search(other, tok, [corpus], limit=50)) == [theirs["record_id"]]
    assert record_ids(search(api, tok, [corpus], limit=50)) == [mine["record_id"]]
    assert search(api, "theirs", [corpus])["items"] == []
    assert record_ids(search(api, f"{tok} theirs", [corpus], mode=None, limit=50)) == [mine["record_id"]]


def test_scope_permissions_and_unknown_corpus(server, make_key, org, api):
    # part1 Authentication 3 and Errors (403 forbidden, 404 not_found, 401); decisions.md
    # "Resolved ambiguities" (a Corpus named in a request outside the key's scope is 403).
    a, b = create_corpus(api, _cid("a")), create_corpus(api, _cid("b"))
    tok = _token()
    wait_searchable(api, ingest(api, text_command(a, "k", tok)))
    with client_for(server, make_key(org, "*", a)) as scoped:
        assert len(search(scoped, tok, [a])["items"]) == 1
        assert_error(search_raw(scoped, tok, [b]), 403, "forbidden")
        assert_error(search_raw(scoped, tok, [a, b]), 403, "forbidden")
    assert_error(search_raw(api, tok, [_cid("missing")]), 404, "not_found")
    assert_error(search_raw(api, tok, [a, _cid("missing")]), 404, "not_found")
    with client_for(server, make_key(org, "content:read")) as no_search:
        assert_error(search_raw(no_search, tok, [a]), 403, "forbidden")
    with client_for(server, make_key(org, "search:query")) as no_read:
        assert_error(search_raw(no_read, tok, [a]), 403, "forbidden")
    with client_for(server, make_key(org, "content:read,search:query")) as both:
        assert len(search(both, tok, [a])["items"]) == 1
    assert_error(httpx.post(f"{server.base_url}/v0/search", json={"query": tok, "corpus_ids": [a]}),
                 401, "invalid_api_key")


# ----------------------------------------------------------------- validation


def test_request_validation(api):
    # part1 rule 20 errors, Limits (16 Corpora, 50 results, query 8192), "Agent tool server" search
    # arguments; decisions.md Search and "Resolved ambiguities" (422 invalid_schema with field).
    corpus = create_corpus(api, _cid())

    def bad(body: dict, status: int, code: str, field: str | None = None) -> dict:
        error = assert_error(api.post("/v0/search", json=body), status, code)
        if field is not None:
            assert error.get("field") == field, error
        return error

    base = {"query": "anything", "corpus_ids": [corpus]}
    bad({**base, "corpus_ids": [f"c{i}" for i in range(17)]}, 422, "invalid_schema", "/corpus_ids")
    bad({**base, "corpus_ids": []}, 422, "invalid_schema", "/corpus_ids")
    bad({**base, "corpus_ids": [corpus, corpus]}, 422, "invalid_schema", "/corpus_ids")
    bad({**base, "limit": 0}, 422, "invalid_schema", "/limit")
    bad({**base, "limit": 51}, 422, "invalid_schema", "/limit")
    bad({**base, "limit": "5"}, 422, "invalid_schema", "/limit")
    error = bad({**base, "query": "q" * 8193}, 422, "query_too_long")
    assert "8192" in error["message"]
    assert search(api, "q" * 8192, [corpus])["items"] == []
    assert search(api, "é" * 8192, [corpus])["items"] == []  # characters, not bytes
    bad({**base, "query": ""}, 422, "invalid_schema", "/query")
    bad({"corpus_ids": [corpus]}, 422, "invalid_schema", "/query")
    bad({"query": "x"}, 422, "invalid_schema", "/corpus_ids")
    bad({**base, "bogus": 1}, 422, "invalid_schema", "/bogus")
    bad({**base, "profile": "other"}, 422, "unsupported_profile")
    bad({**base, "profile": "Not A Profile"}, 422, "invalid_schema", "/profile")
    bad({**base, "mode": "vector"}, 422, "invalid_schema", "/mode")
    bad({**base, "filter": {}}, 422, "invalid_schema")
    bad({**base, "filter": {"source_namespaces": []}}, 422, "invalid_schema")
    bad({**base, "filter": {"source_namespaces": ["a", "a"]}}, 422, "invalid_schema")
    bad({**base, "filter": {"source_namespaces": ["a"], "other": 1}}, 422, "invalid_schema")
    bad({**base, "filter": {"source_namespaces": [f"n{i}" for i in range(51)]}}, 422, "invalid_schema")
    assert_error(api.post("/v0/search", content=b"{not json", headers={"content-type": "application/json"}),
                 400, "malformed_json")
    assert_error(api.post("/v0/search", json=["a"]), 400, "malformed_json")
    # Accepted and ignored: search changes nothing.
    assert search(api, "anything", [corpus], idempotency_key="k")["items"] == []


def test_source_namespace_filter_returns_best_of_those_sources(api):
    # part1 "Agent tool server" search `filter.source_namespaces` (best matches of those sources even
    # when others rank higher); rule 20 (requested filter compiled with the prefilters).
    corpus = create_corpus(api, _cid())
    tok = _token()

    def cmd(namespace: str, key: str, text: str) -> dict:
        return {"idempotency_key": uuid.uuid4().hex,
                "source": {"corpus_id": corpus, "namespace": namespace, "record_key": key},
                "content": {"kind": "text", "text": text}}

    receipts = ingest_batch(api, [cmd("loud", f"l{i}", f"{tok} {tok} {tok} {tok} loud") for i in range(30)]
                            + [cmd("quiet", "q", f"{tok} " + "quiet filler words here " * 40)])
    for receipt in receipts:
        wait_searchable(api, receipt)
    quiet_record = api.get(f"/v0/ingestion-receipts/{receipts[-1]}").json()["record_id"]

    assert quiet_record not in record_ids(search(api, tok, [corpus], limit=5))  # others rank higher
    filtered = search(api, tok, [corpus], limit=5, filter={"source_namespaces": ["quiet"]})
    assert record_ids(filtered) == [quiet_record]
    assert_excerpt_exact(api, filtered["items"][0], must_contain=tok)
    loud = search(api, tok, [corpus], limit=50, filter={"source_namespaces": ["loud"]})
    assert len(loud["items"]) == 30 and quiet_record not in record_ids(loud)
    both = search(api, tok, [corpus], limit=50, filter={"source_namespaces": ["quiet", "loud", "absent"]})
    assert len(both["items"]) == 31
    assert search(api, tok, [corpus], filter={"source_namespaces": ["absent"]})["items"] == []


# ----------------------------------------------------------------- profiles


def test_list_search_profiles(server, make_key, org, api):
    # part1 rule 21 (default first); decisions.md Search (SearchProfileList, built-in default).
    r = api.get("/v0/search/profiles")
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert set(r.json()) == {"items"}
    first = items[0]
    assert first["name"] == "default" and first["default"] is True
    assert set(first) == {"name", "version", "default", "modes", "max_latency_ms", "max_query_chars"}
    assert set(first["modes"]) == {"lexical", "semantic", "hybrid"}
    assert first["max_latency_ms"] == 2000 and first["max_query_chars"] == 8192
    assert [p for p in items if p["default"]] == [first]
    # issue "Search quality": reciprocal-rank fusion stays available beside the default's z-score fusion.
    assert [(p["name"], p["version"]) for p in items] == [("default", "2"), ("rrf", "1")]
    with client_for(server, make_key(org, "search:query")) as only_search:
        assert only_search.get("/v0/search/profiles").json() == r.json()
    with client_for(server, make_key(org, "content:read,corpora:read")) as no_search:
        assert_error(no_search.get("/v0/search/profiles"), 403, "forbidden")
    assert_error(httpx.get(f"{server.base_url}/v0/search/profiles"), 401, "invalid_api_key")


# ----------------------------------------------------------------- outages and replay (an own server)


@pytest.fixture(scope="module", autouse=True)
def _own_server_starting(databases, tmp_path_factory):
    """Starts the own server in the background when the module starts (it takes seconds on a
    loaded machine), so that it is ready by the time the tests that need it run."""
    started: dict = {}

    def start():
        try:
            url = databases.create()
            proc = ServerProcess(url, tmp_path_factory.mktemp("own"), LEXICAL_ONLY)
            started["server"] = proc
            with psycopg.connect(url, autocommit=True) as conn:
                secret = keys.create_key(conn, "own", keys.parse_actions("*"), None, None).secret
            started["value"] = (proc, url, secret)
        except BaseException as exc:  # reported by own_server
            started["error"] = exc

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    yield thread, started
    thread.join()
    if "server" in started:
        started["server"].stop()


@pytest.fixture(scope="module")
def own_server(_own_server_starting):
    """A second `contentsvc run` on its own database and CONTENTSVC_HOME, so that deleting index
    files or cutting over generations disturbs no other test. Each test uses its own Corpus."""
    thread, started = _own_server_starting
    thread.join()
    if "error" in started:
        raise started["error"]
    return started["value"]


def _serving_generation(url: str) -> str:
    with psycopg.connect(url) as conn:
        [(generation,)] = conn.execute(
            "SELECT generation_id FROM search_generations WHERE kind = 'lexical' AND state = 'serving'").fetchall()
    return generation


def _availability_counts(url: str, corpus: str) -> dict[str, dict[str, int]]:
    """version_id -> {state: journal events} for the Versions of one Corpus."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT version_id, payload->>'state', count(*) FROM journal WHERE kind = 'record.availability_changed'"
            " AND corpus_id = %s AND payload ? 'state' GROUP BY 1, 2", (corpus,)).fetchall()
    out: dict[str, dict[str, int]] = {}
    for version_id, state, count in rows:
        out.setdefault(version_id, {})[state] = count
    return out


def test_missing_index_files_are_503_never_empty(own_server):
    # part1 "What the service does" (a search that cannot reach its index fails with 503 instead of
    # returning no hits), Errors (503 search_unavailable); rule 20 errors (503 dependency unavailable).
    proc, url, secret = own_server
    with client_for(proc, secret) as client:
        corpus = create_corpus(client, "outage")
        tok = _token()
        first = wait_searchable(client, ingest(client, text_command(corpus, "a", f"{tok} first")))
        assert only(search(client, tok, [corpus]))["record_id"] == first["record_id"]
        # part1 rule 20: semantic-only queries require vector coverage; hybrid stays lexical.
        assert client.get(f"/v0/corpora/{corpus}").json()["vector_spaces"] == []
        assert_error(search_raw(client, tok, [corpus], mode="semantic"), 422, "unsupported_search")
        assert record_ids(search(client, tok, [corpus], mode=None)) == [first["record_id"]]

        shutil.rmtree(proc.home / "indexes" / "lexical" / _serving_generation(url))
        for mode in ("lexical", None, "hybrid"):
            body = assert_error(search_raw(client, tok, [corpus], mode=mode), 503, "search_unavailable")
            assert body["retryable"] is True

        # The lexical projector refolds the lost generation from the journal (without publishing
        # availability again) and search answers again, with old and new Records.
        second = wait_searchable(client, ingest(client, text_command(corpus, "b", f"{tok} second")))
        deadline = time.time() + 40
        while True:
            r = search_raw(client, tok, [corpus])
            if r.status_code == 200 and len(r.json()["items"]) == 2:
                break
            assert r.status_code in (200, 503), r.text
            assert time.time() < deadline, r.text
            time.sleep(0.1)
        assert set(record_ids(r.json())) == {first["record_id"], second["record_id"]}
    counts = _availability_counts(url, corpus)
    assert counts == {v: {"materialized": 1, "building_baseline": 1, "retrieval_ready": 1}
                      for v in (first["version_id"], second["version_id"])}, counts


def test_replay_cuts_over_without_a_gap(own_server):
    # decisions.md Operator (`projector replay NAME`, `projector status`); part1 "What the service
    # does" (never an empty success); search/replay.py: a generation built beside the serving one,
    # an atomic cutover, searchers see the old index or the new one, never a gap; availability
    # published once per Version even while Records are ingested during the replay.
    proc, url, secret = own_server
    client = client_for(proc, secret)
    stop = threading.Event()
    try:
        corpus = create_corpus(client, "replay")
        run = uuid.uuid4().hex[:6]
        tokens = [f"rp{run}x{i:03d}" for i in range(50)]
        receipts = ingest_batch(client, [
            text_command(corpus, f"r{i}", f"{tokens[i]} shared{run} body number {i} 😀 東京") for i in range(50)])
        expected = {}
        for i, receipt_id in enumerate(receipts):
            expected[tokens[i]] = wait_searchable(client, receipt_id)["record_id"]
        old_generation = _serving_generation(url)
        queries = tokens[::7]
        before = {q: cited(search(client, q, [corpus])) for q in queries}
        assert all([hit[1] for hit in before[q]] == [expected[q]] for q in queries)
        assert len(search(client, f"shared{run}", [corpus], limit=50)["items"]) == 50

        failures: list[str] = []
        searched = [0]
        during: list[tuple[str, str]] = []  # (token, receipt_id) ingested while the replay runs

        def searcher():
            with client_for(proc, secret) as c:
                i = 0
                while not stop.is_set():
                    q = queries[i % len(queries)]
                    i += 1
                    r = search_raw(c, q, [corpus])
                    if r.status_code != 200:
                        failures.append(f"{q}: {r.status_code} {r.text}")
                    elif [hit["record_id"] for hit in r.json()["items"]] != [expected[q]]:
                        failures.append(f"{q}: {r.json()}")
                    searched[0] += 1

        def writer():
            with client_for(proc, secret) as c:
                i = 0
                while not stop.wait(0.05):
                    token = f"dur{run}x{i:03d}"
                    during.append((token, ingest(c, text_command(corpus, f"d{i}", f"{token} during"))))
                    i += 1

        threads = [threading.Thread(target=searcher), threading.Thread(target=writer)]
        for thread in threads:
            thread.start()
        env = dict(os.environ, CONTENTSVC_DATABASE_URL=url, CONTENTSVC_HOME=str(proc.home), COLUMNS="250")
        replay = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "replay", "lexical"],
                                env=env, capture_output=True, text=True, timeout=120)
        time.sleep(0.5)  # keep searching across the cutover and the projector's switch
        stop.set()
        for thread in threads:
            thread.join()
        assert replay.returncode == 0, replay.stderr + replay.stdout
        assert failures == [], failures[:5]
        assert searched[0] >= 5 and len(during) >= 3

        new_generation = _serving_generation(url)
        assert new_generation != old_generation and new_generation in replay.stdout
        status = subprocess.run([sys.executable, "-m", "contentsvc.cli", "projector", "status"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        [line] = [line for line in status.stdout.splitlines() if new_generation in line]
        assert "serving" in line and "lexical" in line
        # A retired generation is listed, with its bytes, while its files remain (until gc deletes them).
        [line] = [line for line in status.stdout.splitlines() if old_generation in line]
        assert "retired" in line

        after = {q: cited(search(client, q, [corpus])) for q in queries}
        assert after == before  # the same citations (BM25 scores may differ: no deleted documents now)
        late_token = f"late{run}x001"
        late = wait_searchable(client, ingest(client, text_command(corpus, "late", f"{late_token} shared{run}")))
        assert only(search(client, late_token, [corpus]))["record_id"] == late["record_id"]
        assert len(search(client, f"shared{run}", [corpus], limit=50)["items"]) == 50
        for token, receipt_id in during:  # ingested during the replay: searchable, found
            receipt = wait_searchable(client, receipt_id)
            assert only(search(client, token, [corpus]))["version_id"] == receipt["version_id"]

        counts = _availability_counts(url, corpus)
        assert len(counts) == 50 + len(during) + 1
        wrong = {v: c for v, c in counts.items()
                 if c.get("retrieval_ready") != 1 or c.get("building_baseline", 0) > 1 or c.get("materialized") != 1}
        assert wrong == {}, wrong  # nothing published twice, nothing left unpublished
    finally:
        stop.set()
        client.close()
