"""`[plugins.<plugin_id>]` and `[destinations.<destination_id>]` in the startup configuration
(decisions-part2, "Startup configuration")."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tomllib
from pathlib import Path

import pytest

from contentsvc.config import ConfigError, load_configuration, load_settings
from contentsvc.config.render import render

PLUGINS = Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins"
WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()
CONFIGURABLE = {
    "manifest_version": 1, "id": "feeds", "version": "2.0.0", "plugin_api": "0.3", "title": "Feeds",
    "configuration_schema": {"type": "object", "additionalProperties": False,
                             "properties": {"timeout_seconds": {"type": "integer", "minimum": 1}}},
    "contributions": {"connector": {"kinds": [{"kind": "feed", "description": "feeds", "config_schema": {},
                                               "credential": "none", "default_interval_seconds": 300,
                                               "max_items": 100}]}},
}


@pytest.fixture(autouse=True)
def cwd(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


@pytest.fixture
def deploy(tmp_path) -> Path:
    """A deployment folder holding the pdf plugin's manifest and a configurable connector's."""
    folder = tmp_path / "deploy"
    (folder / "plugins" / "pdf").mkdir(parents=True)
    shutil.copy(PLUGINS / "pdf" / "contentsvc-plugin.json", folder / "plugins" / "pdf")
    (folder / "plugins" / "feeds").mkdir()
    (folder / "plugins" / "feeds" / "contentsvc-plugin.json").write_text(json.dumps(CONFIGURABLE))
    return folder


PDF = '[plugins.pdf]\nendpoint = "http://127.0.0.1:8095"\nversion = "0.1.0"\nmanifest = "plugins/pdf/contentsvc-plugin.json"\n'
FEEDS = ('[plugins.feeds]\nendpoint = "http://127.0.0.1:9000"\nversion = "2.0.0"\n'
         'manifest = "plugins/feeds/contentsvc-plugin.json"\n')


def load(folder: Path, text: str, environ: dict | None = None):
    path = folder / "contentsvc.toml"
    path.write_text(text)
    return load_configuration(path, environ or {})


def refusal(folder: Path, text: str, environ: dict | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load(folder, text, environ)
    return str(caught.value)


def test_a_pinned_plugin_reads_its_manifest_relative_to_the_file(deploy):
    # decisions-part2: manifest path resolved against the file's folder; routes default to every declared type
    configuration = load(deploy, PDF + 'token = "env:PDF_TOKEN"\n', {"PDF_TOKEN": "tok-123"})
    entry = configuration.settings.plugins["pdf"]
    assert entry.manifest == (deploy / "plugins" / "pdf" / "contentsvc-plugin.json").resolve()
    assert entry.token == "tok-123"
    pinned = configuration.plugins["pdf"]
    assert pinned.pinned.digest == hashlib.sha256(entry.manifest.read_bytes()).hexdigest()
    assert pinned.roles == ["normalizer:application/pdf"]
    assert [(r.media_type, r.optional) for r in pinned.settings.routes] == [("application/pdf", False)]


def test_config_check_masks_the_token_and_prints_a_loadable_file(deploy, tmp_path):
    # decisions-part2: config check prints secrets as "***"
    configuration = load(deploy, PDF + 'token = "tok-secret-9"\n[plugins.pdf.configuration]\n' + FEEDS
                         + '[plugins.feeds.configuration]\ntimeout_seconds = 5\n'
                         + f'[destinations.alerts]\nurl = "https://hooks.example/in"\nsecret = "{WEBHOOK_SECRET}"\n'
                         + 'headers = {"X-Team" = "ops"}\n')
    text = render(configuration)
    assert "tok-secret-9" not in text and WEBHOOK_SECRET not in text
    printed = tomllib.loads(text)
    assert printed["plugins"]["pdf"]["token"] == "***"
    assert printed["plugins"]["feeds"]["configuration"] == {"timeout_seconds": 5}
    assert printed["destinations"]["alerts"]["secret"] == "***"
    reprinted = tmp_path / "printed.toml"
    reprinted.write_text(text.replace('"***"', '"' + WEBHOOK_SECRET + '"'))
    assert load_settings(reprinted, {}).plugins["feeds"] == configuration.settings.plugins["feeds"]


@pytest.mark.parametrize(("text", "message"), [
    (PDF.replace('version = "0.1.0"\n', ""), "plugins.pdf.version: is required"),
    (PDF.replace("0.1.0", "0.2.0"), "plugins.pdf.version: must equal the manifest's version '0.1.0'"),
    (PDF.replace("[plugins.pdf]", "[plugins.other]"),
     "plugins.other: the manifest's id is 'pdf': the table must be [plugins.pdf]"),
    (PDF.replace("[plugins.pdf]", "[plugins.Pdf]"), "plugins.Pdf: the id must match ^[a-z][a-z0-9_-]{0,63}$"),
    (PDF.replace("http://127.0.0.1:8095", "ftp://host"),
     "plugins.pdf.endpoint: must be an absolute http(s) URL (its port, when given, from 1 to 65535)"),
    (PDF.replace("http://127.0.0.1:8095", "http://127.0.0.1:0"),
     "plugins.pdf.endpoint: must be an absolute http(s) URL (its port, when given, from 1 to 65535)"),
    # the port `plugin serve` is started on must be written, not implied (it was taken as 80)
    (PDF.replace("http://127.0.0.1:8095", "http://127.0.0.1") + 'launch = "pdf"\n',
     "plugins.pdf.launch: a launched plugin listens on loopback: the endpoint must be http://127.0.0.1:<port>"),
    (PDF + "timeout = 3\n", "plugins.pdf.timeout: unknown key"),
    (PDF + 'routes = [{media_type = "image/png"}]\n',
     "plugins.pdf.routes[0].media_type: 'image/png' is not a media type the manifest's normalizer declares"),
    (PDF + 'launch = "rss"\n', "plugins.pdf.launch: starts the first-party plugin rss, whose id is not 'pdf'"),
    (PDF + 'launch = "nope"\n',
     'plugins.pdf.launch: must be one of "fixture-evaluator", "pdf", "query", "rss", "social_list"'),
    (FEEDS + "[plugins.feeds.configuration]\ntimeout_seconds = \"slow\"\n",
     "plugins.feeds.configuration.timeout_seconds: 'slow' is not of type 'integer'"),
    (FEEDS + 'kinds = ["rss"]\n', "plugins.feeds.kinds[0]: 'rss' is not a connector kind the manifest declares"),
    (FEEDS + 'token = "env:FEEDS_TOKEN"\n',
     "plugins.feeds.token: names the environment variable FEEDS_TOKEN, which is not set"),
])
def test_plugin_refusals_name_the_key_path(deploy, text, message):
    # decisions-part2: an invalid file stops the process naming the TOML key path
    assert refusal(deploy, text) == message


def test_an_unreadable_or_invalid_manifest_is_refused(deploy):
    # decisions-part2: unreadable manifest is a start error
    missing = refusal(deploy, PDF.replace("plugins/pdf/", "plugins/none/"))
    assert missing.startswith("plugins.pdf.manifest: cannot read ")
    (deploy / "plugins" / "pdf" / "contentsvc-plugin.json").write_text('{"id": "pdf"}')
    assert refusal(deploy, PDF).startswith("plugins.pdf.manifest: ") and "not a valid plugin manifest" in \
        refusal(deploy, PDF)


def test_two_normalizers_for_one_media_type_break_a_startup_rule(deploy):
    # part 2 activation rules kept at start: one normalizer per media type
    (deploy / "plugins" / "pdf2").mkdir()
    manifest = json.loads((deploy / "plugins" / "pdf" / "contentsvc-plugin.json").read_text())
    (deploy / "plugins" / "pdf2" / "contentsvc-plugin.json").write_text(json.dumps({**manifest, "id": "pdf2"}))
    second = PDF.replace("[plugins.pdf]", "[plugins.pdf2]").replace("plugins/pdf/", "plugins/pdf2/")
    assert refusal(deploy, PDF + second) == \
        "plugins.pdf2.routes: normalizer:application/pdf is already served by plugin pdf"


def _ingestion_pin(deploy: Path, plugin_id: str, space: str, port: int) -> str:
    manifest = {"manifest_version": 1, "id": plugin_id, "version": "1.0.0", "plugin_api": "0.6", "title": plugin_id,
                "contributions": {"ingestion": {"spaces": [{"name": space, "model": "m", "dimensions": 8,
                                                            "metric": "cosine", "modalities": ["text"]}],
                                                "source_formats": ["text/html"]}}}
    (deploy / "plugins" / plugin_id).mkdir()
    (deploy / "plugins" / plugin_id / "contentsvc-plugin.json").write_text(json.dumps(manifest))
    return (f'[plugins.{plugin_id}]\nendpoint = "http://127.0.0.1:{port}"\nversion = "1.0.0"\n'
            f'manifest = "plugins/{plugin_id}/contentsvc-plugin.json"\n')


def test_two_ingestion_plugins_for_one_source_format_break_a_startup_rule(deploy):
    # part 2 activation rules kept at start, by the same function: valid ingestion source routes
    text = _ingestion_pin(deploy, "embed_a", "docs_a", 9001) + _ingestion_pin(deploy, "embed_b", "docs_b", 9002)
    assert refusal(deploy, text) == "plugins.embed_b.manifest: source format text/html is already served by " \
                                    "plugin embed_a"


DESTINATION = '[destinations.alerts]\nurl = "{url}"\nsecret = "{secret}"\n'


@pytest.mark.parametrize(("text", "message"), [
    (DESTINATION.format(url="http://hooks.example/in", secret=WEBHOOK_SECRET),
     "destinations.alerts.url: must be an https URL (http only for a loopback host or with allow_http = true)"),
    (DESTINATION.format(url="http://127.0.0.1:0/in", secret=WEBHOOK_SECRET),
     "destinations.alerts.url: must be an absolute https URL (its port, when given, from 1 to 65535)"),
    (DESTINATION.format(url="https://hooks.example/in", secret="whsec_c2hvcnQ="),
     "destinations.alerts.secret: must be whsec_ followed by the base64 of 24 to 64 bytes"),
    (DESTINATION.format(url="https://hooks.example/in", secret=WEBHOOK_SECRET) + 'headers = {"Webhook-Id" = "x"}\n',
     "destinations.alerts.headers.Webhook-Id: may not be set: the delivery sets it"),
    (DESTINATION.format(url="https://hooks.example/in", secret=WEBHOOK_SECRET) + "headers = {"
     + ", ".join(f'"x-h{n}" = "v"' for n in range(17)) + "}\n", "destinations.alerts.headers: at most 16 headers"),
    # A line break would end the header (and start another); a value is sent as it is written.
    (DESTINATION.format(url="https://hooks.example/in", secret=WEBHOOK_SECRET)
     + 'headers = {"X-Team" = "ops\\r\\nX-Forged: 1"}\n',
     "destinations.alerts.headers.X-Team: must be printable ASCII, without line breaks or surrounding spaces"),
    (DESTINATION.format(url="https://hooks.example/in", secret=WEBHOOK_SECRET) + 'headers = {"X-Team" = "équipe"}\n',
     "destinations.alerts.headers.X-Team: must be printable ASCII, without line breaks or surrounding spaces"),
    (DESTINATION.format(url="https://ops:hunter2@hooks.example/in", secret=WEBHOOK_SECRET),
     "destinations.alerts.url: may not hold a user name or password: put the receiver's credentials in headers"),
    (DESTINATION.format(url="https://hooks.example/in", secret=WEBHOOK_SECRET).replace("alerts", "Alerts"),
     "destinations.Alerts: the id must match ^[a-z][a-z0-9_-]{0,63}$"),
    ('[destinations.alerts]\nurl = "https://hooks.example/in"\n', "destinations.alerts.secret: is required"),
])
def test_destination_refusals_name_the_key_path(tmp_path, text, message):
    # decisions-part2 [destinations.<destination_id>]
    assert refusal(tmp_path, text) == message


def test_http_destinations_for_loopback_or_when_allowed(tmp_path):
    text = DESTINATION.format(url="http://127.0.0.1:9999/in", secret=WEBHOOK_SECRET)
    text += DESTINATION.format(url="http://hooks.internal/in", secret=WEBHOOK_SECRET).replace("alerts", "internal")
    text += "allow_http = true\n"
    settings = load(tmp_path, text).settings
    assert sorted(settings.destinations) == ["alerts", "internal"]
