"""The first-party `rss` connector as a real process reading real RSS 2.0, RSS 1.0, Atom and JSON
Feed files (and an ISO-8859-1 one, a malformed one, one that is not a feed, one too large) from a real HTTP server on loopback (decisions-part2, "Plugin processes and first-party
plugins": `rss`)."""

from __future__ import annotations

import base64
import re
import shutil

import httpx
import pytest

from tests.integration.feed_server import FEEDS, FIXTURE_PORT, FeedServer
from tests.integration.first_party_checks import failures, plugin_check
from tests.integration.plugin_processes import PLUGINS, PluginProcess

ALLOW = {"allow_private_networks": True}
NOW = "2026-03-05T12:00:00Z"


@pytest.fixture(scope="module")
def feeds():
    server = FeedServer.on_fixture_port_or_any()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rss_plugin(tmp_path_factory):
    plugin = PluginProcess("rss", tmp_path_factory.mktemp("rss"))
    yield plugin
    plugin.stop()


def call(plugin: PluginProcess, route: str, url: str, *, checkpoint: object = None, configuration: dict | None = None,
         credential: dict | None = None, now: str = NOW, honor_ttl: bool | None = None) -> httpx.Response:
    config: dict = {"url": url}
    if honor_ttl is not None:
        config["honor_ttl"] = honor_ttl
    return httpx.post(f"{plugin.base_url}/v0/contributions/connector/{route}", timeout=30, json={
        "invocation_id": "inv", "contribution": "connector", "organization_id": "org",
        "configuration": ALLOW if configuration is None else configuration,
        "connector": {"instance_id": "con1", "kind": "rss", "corpus_id": "c1", "source_namespace": "feeds",
                      "config": config},
        "credential": credential, "now": now, "checkpoint": checkpoint, "page_in_run": 0, "reads_today": 0})


def fetch(plugin: PluginProcess, url: str, **options) -> dict:
    answer = call(plugin, "fetch", url, **options)
    assert answer.status_code == 200, answer.text
    return answer.json()


def parts(item: dict) -> dict[str, str]:
    return {part["key"]: part["content"]["text"] for part in item["content"]["parts"]}


def test_rss2_items_keys_revisions_positions_and_text(rss_plugin, feeds):
    # decisions-part2 rss: record_key guid, else link, else sha256(title+published); revision 32 hex;
    # source_position published (RFC 3339) else feed index; Parts title and body (HTML reduced to text)
    page = fetch(rss_plugin, f"{feeds.base_url}/feeds/harbour.rss")
    items = page["items"]
    assert [item["record_key"] for item in items][:2] == ["notice-1002", "https://harbour.example/notices/dredging"]
    assert re.fullmatch(r"[0-9a-f]{64}", items[2]["record_key"])
    assert all(re.fullmatch(r"[0-9a-f]{32}", item["revision"]) for item in items)
    assert [item["source_position"] for item in items] == ["2026-03-03T09:30:00Z", "2026-03-02T08:00:00Z", "2"]
    assert parts(items[0]) == {"title": "Crane four inspected",
                               "body": "Bearings on crane four were replaced.\nWork resumes Monday."}
    assert parts(items[2]) == {"body": "Night traffic resumes at the north quay."}
    assert items[0]["content"]["parts"][0]["role"] == "title"
    assert page["more"] is False  # one page per run
    checkpoint = page["checkpoint"]
    assert checkpoint["etag"] and checkpoint["last_modified"] and checkpoint["last_fetch_at"] == NOW
    assert checkpoint["seen"] == {item["record_key"]: item["revision"] for item in items}


def test_atom_and_json_feed(rss_plugin, feeds):
    # decisions-part2 rss: Atom and JSON Feed parsed too; dates as RFC 3339 UTC
    atom = fetch(rss_plugin, f"{feeds.base_url}/feeds/harbour.atom")["items"]
    assert [i["record_key"] for i in atom] == ["urn:uuid:4a1c2f6e-0000-4000-8000-000000000002",
                                               "urn:uuid:4a1c2f6e-0000-4000-8000-000000000003"]
    assert [i["source_position"] for i in atom] == ["2026-03-03T10:00:00Z", "2026-03-01T17:45:00Z"]
    assert parts(atom[0])["body"] == "The pilot boat Ærø is back in service."
    assert parts(atom[1])["body"] == "All lights on the west quay are LED now."
    json_feed = fetch(rss_plugin, f"{feeds.base_url}/feeds/harbour.json")["items"]
    assert [i["record_key"] for i in json_feed] == ["bulletin-7", "bulletin-6"]
    assert [i["source_position"] for i in json_feed] == ["2026-03-04T07:15:00Z", "2026-03-02T10:00:00Z"]
    assert parts(json_feed[0]) == {"title": "Tide tables for April", "body": "The April tide tables are published."}
    assert parts(json_feed[1]) == {"body": "Ferry timetable unchanged."}


def test_relative_links_resolve_against_the_feed_address_and_xml_base(rss_plugin, feeds):
    # decisions-part2 rss: record_key guid, else link; a relative permalink guid or link is made
    # absolute against the feed's own address (and an Atom xml:base), so that an item keeps one
    # key wherever its feed is read from; a guid that is not a permalink stays as written.
    rss2 = fetch(rss_plugin, f"{feeds.base_url}/feeds/relative.rss")["items"]
    assert [i["record_key"] for i in rss2] == [f"{feeds.base_url}/feeds/notices/7", f"{feeds.base_url}/archive/8", "9"]
    atom = fetch(rss_plugin, f"{feeds.base_url}/feeds/relative.atom")["items"]
    assert [i["record_key"] for i in atom] == ["https://harbour.example/news/quay/1", "https://ferries.example/boats/2"]


def test_conditional_get_and_304_is_an_empty_page(rss_plugin, feeds):
    # decisions-part2 rss: conditional GET with the checkpoint's ETag/Last-Modified; 304 = empty page
    url = f"{feeds.base_url}/feeds/harbour.atom"
    first = fetch(rss_plugin, url)
    feeds.requests.clear()
    second = fetch(rss_plugin, url, checkpoint=first["checkpoint"], now="2026-03-05T12:05:00Z")
    sent = feeds.requests[-1][1]
    assert sent["if-none-match"] == first["checkpoint"]["etag"]
    assert sent["if-modified-since"] == first["checkpoint"]["last_modified"]
    assert second["items"] == [] and second["more"] is False
    assert second["checkpoint"]["last_fetch_at"] == "2026-03-05T12:05:00Z"
    assert second["checkpoint"]["seen"] == first["checkpoint"]["seen"]


def test_an_unchanged_revision_is_not_sent_again(rss_plugin, feeds):
    # decisions-part2 rss: seen {record_key: revision}; an unchanged revision is not re-sent
    path = "/feeds/changing.rss"
    original = (FEEDS / "harbour.rss").read_bytes()
    feeds.overrides[path] = original
    first = fetch(rss_plugin, feeds.base_url + path)
    feeds.overrides[path] = original.replace(b"Work resumes Monday.", b"Work resumes Tuesday.")
    second = fetch(rss_plugin, feeds.base_url + path, checkpoint=first["checkpoint"])
    assert [item["record_key"] for item in second["items"]] == ["notice-1002"]
    assert second["items"][0]["revision"] != first["items"][0]["revision"]
    assert second["checkpoint"]["seen"]["notice-1002"] == second["items"][0]["revision"]
    assert len(second["checkpoint"]["seen"]) == 3


def test_honor_ttl_answers_not_due_until_the_ttl_elapsed(rss_plugin, feeds):
    # decisions-part2 rss: with honor_ttl, a feed <ttl> (minutes) not yet elapsed since the last fetch is not_due
    url = f"{feeds.base_url}/feeds/harbour.rss"
    first = fetch(rss_plugin, url, honor_ttl=True)
    early = fetch(rss_plugin, url, honor_ttl=True, checkpoint=first["checkpoint"], now="2026-03-05T12:30:00Z")
    assert early["not_due"] is True and early["items"] == [] and early["more"] is False
    assert early["checkpoint"] == first["checkpoint"]
    late = fetch(rss_plugin, url, honor_ttl=True, checkpoint=first["checkpoint"], now="2026-03-05T13:01:00Z")
    assert not late.get("not_due") and late["checkpoint"]["last_fetch_at"] == "2026-03-05T13:01:00Z"
    # without honor_ttl the ttl is ignored
    assert not fetch(rss_plugin, url, checkpoint=first["checkpoint"], now="2026-03-05T12:30:00Z").get("not_due")


def test_loopback_is_refused_unless_private_networks_are_allowed(rss_plugin, feeds):
    # decisions-part2 rss: loopback/private/link-local/unique-local refused: address_not_allowed, class source
    for url in (f"{feeds.base_url}/feeds/harbour.rss", f"http://localhost:{feeds.port}/feeds/harbour.rss",
                "http://[::1]:9/feed", "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/feed"):
        answer = call(rss_plugin, "fetch", url, configuration={})
        assert answer.status_code == 502, url
        body = answer.json()
        assert (body["code"], body["error_class"], body["retryable"]) == ("address_not_allowed", "source", False)


def test_redirects_are_followed_at_most_five_times(rss_plugin, feeds):
    # decisions-part2 rss: redirects followed (each address guarded), at most 5
    assert len(fetch(rss_plugin, f"{feeds.base_url}/redirect/5/feeds/harbour.rss")["items"]) == 3
    answer = call(rss_plugin, "fetch", f"{feeds.base_url}/redirect/6/feeds/harbour.rss")
    assert answer.status_code == 502 and answer.json()["code"] == "too_many_redirects"
    assert answer.json()["error_class"] == "source"


@pytest.mark.parametrize(("status", "error_class", "retryable"), [
    (401, "access", False), (403, "access", False), (404, "source", False), (410, "source", False),
    (503, "transient", True), (500, "transient", True)])
def test_http_failures_carry_their_class(rss_plugin, feeds, status, error_class, retryable):
    # decisions-part2 rss: 401/403 access (http_401/http_403); 404/410 source; 5xx transient with Retry-After
    answer = call(rss_plugin, "fetch", f"{feeds.base_url}/status/{status}")
    body = answer.json()
    assert answer.status_code >= 500
    assert (body["code"], body["error_class"], body["retryable"]) == (f"http_{status}", error_class, retryable)
    if status == 503:
        assert body["retry_after_seconds"] == 7


def test_a_timeout_is_transient(rss_plugin, feeds):
    # decisions-part2 rss: timeouts are class transient
    answer = call(rss_plugin, "fetch", f"{feeds.base_url}/slow/feeds/harbour.rss",
                  configuration={**ALLOW, "timeout_seconds": 1})
    body = answer.json()
    assert (body["code"], body["error_class"], body["retryable"]) == ("timeout", "transient", True)
    assert body["retry_after_seconds"] >= 1


def test_rss1_is_read_like_the_others(rss_plugin, feeds):
    # decisions-part2 rss: parses RSS 2.0/1.0/Atom/JSON Feed with feedparser
    page = fetch(rss_plugin, f"{feeds.base_url}/feeds/harbour.rdf")
    assert page["diagnostics"]["feed_version"] == "rss10"
    assert [item["record_key"] for item in page["items"]] == [
        "https://harbour.example/notices/tide-tables", "https://harbour.example/notices/pilot-boarding"]
    assert parts(page["items"][0]) == {"title": "Tide tables for April", "body": "Spring tides peak on the ninth."}
    assert page["items"][0]["source_position"] == "2026-03-02T08:00:00Z"


def test_an_encoding_the_server_mislabels_is_a_warning_not_a_failure(rss_plugin, feeds):
    # A feed encoded in ISO-8859-1 as its XML declaration says, served as UTF-8: feedparser flags it
    # (CharacterEncodingOverride) and still reads the right text; the run shows it in diagnostics.
    path = "/feeds/capitainerie-latin1.rss"
    feeds.content_types[path] = "application/rss+xml; charset=utf-8"
    try:
        page = fetch(rss_plugin, feeds.base_url + path)
    finally:
        del feeds.content_types[path]
    [item] = page["items"]
    assert parts(item)["title"] == "Quai numéro deux fermé"
    assert "jusqu'à vendredi" in parts(item)["body"]
    assert page["diagnostics"]["encoding_warning"] == "CharacterEncodingOverride"
    assert "encoding_warning" not in fetch(rss_plugin, feeds.base_url + path)["diagnostics"]  # labelled right


@pytest.mark.parametrize(("path", "code"), [("/feeds/malformed.rss", "malformed_feed"),
                                            ("/feeds/not-a-feed.html", "invalid_feed")])
def test_malformed_xml_and_a_page_that_is_not_a_feed_are_source_errors(rss_plugin, feeds, path, code):
    # decisions-part2 rss + Runs: a plugin error ends the run with its error_class and code (health
    # last_error, not access_error); a broken document publishes nothing rather than a guess
    answer = call(rss_plugin, "fetch", feeds.base_url + path)
    body = answer.json()
    assert answer.status_code >= 400
    assert (body["code"], body["error_class"], body["retryable"]) == (code, "source", False)


def test_a_feed_over_max_bytes_is_refused_without_reading_it_all(rss_plugin, feeds):
    # decisions-part2 rss: plugin configuration max_bytes bounds the fetch
    feeds.overrides["/feeds/huge.rss"] = (FEEDS / "harbour.rss").read_bytes().replace(
        b"<ttl>60</ttl>", b"<ttl>60</ttl>" + b"<!-- padding -->" * 200_000)  # about 3 MiB
    try:
        answer = call(rss_plugin, "fetch", f"{feeds.base_url}/feeds/huge.rss",
                      configuration={**ALLOW, "max_bytes": 1_048_576})
        assert answer.json()["code"] == "feed_too_large" and answer.json()["error_class"] == "source"
        page = fetch(rss_plugin, f"{feeds.base_url}/feeds/huge.rss")  # within the default 10 MiB
        assert len(page["items"]) == 3
    finally:
        del feeds.overrides["/feeds/huge.rss"]


def test_basic_and_bearer_credentials_and_check_credential(rss_plugin, feeds):
    # decisions-part2 rss: credential {username, password} is Basic, {token} is Bearer; check_credential
    url = f"{feeds.base_url}/auth/feeds/harbour.rss"
    feeds.expected_authorization = "Basic " + base64.b64encode(b"harbour:s3cret-pass").decode()
    basic = {"username": "harbour", "password": "s3cret-pass"}
    assert len(fetch(rss_plugin, url, credential=basic)["items"]) == 3
    assert call(rss_plugin, "check_credential", url, credential=basic).json() == {"status": "ok"}
    refused = call(rss_plugin, "check_credential", url, credential={"username": "harbour", "password": "wrong"})
    assert refused.json()["code"] == "http_401" and refused.json()["error_class"] == "access"
    feeds.expected_authorization = "Bearer feed-token-9f"
    assert len(fetch(rss_plugin, url, credential={"token": "feed-token-9f"})["items"]) == 3
    assert "feed-token-9f" not in call(rss_plugin, "fetch", url, credential={"token": "feed-token-9f"}).text


def test_contract_check_certifies_the_shipped_fixtures(rss_plugin, feeds, tmp_path):
    # decisions-part2 "Contract check": fetch pages feeding the checkpoint back (the second is a 304),
    # check_credential, secrets not echoed; loopback feeds need allow_private_networks
    folder = PLUGINS / "rss"
    if feeds.port != FIXTURE_PORT:  # the fixture port is taken: the same fixtures, pointed at this server
        folder = tmp_path / "rss"
        shutil.copytree(PLUGINS / "rss", folder)
        for fixture in (folder / "fixtures").glob("*.json"):
            fixture.write_text(fixture.read_text().replace(f"127.0.0.1:{FIXTURE_PORT}", f"127.0.0.1:{feeds.port}"))
    settings = tmp_path / "settings.toml"
    settings.write_text("[configuration]\nallow_private_networks = true\n")
    code, report = plugin_check(folder, rss_plugin.base_url, "--settings", str(settings))
    assert code == 0, failures(report)
    assert report["certified"] is True and report["skipped"] == 0
    fetched = [check for check in report["checks"] if check["id"] == "connector.fetch"]
    assert len(fetched) == 3 and all(check["status"] == "pass" for check in fetched)
    # without the setting, the same fixtures are refused: the feeds are on loopback
    code, report = plugin_check(folder, rss_plugin.base_url)
    assert code == 1
    assert any(issue["message"].find("address_not_allowed") >= 0 or "loopback" in issue["message"]
               for check in failures(report) for issue in check["issues"])
