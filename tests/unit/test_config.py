"""The startup configuration: defaults, then the file, then the environment
(decisions-part2: "Startup configuration")."""

from __future__ import annotations

import base64
import hashlib
import tomllib
from pathlib import Path

import msgspec
import pytest

from contentsvc.config import ConfigError, Settings, load_configuration, load_settings
from contentsvc.config.render import render

KEY = base64.b64encode(b"k" * 32).decode()
OLD_KEY = base64.b64encode(b"o" * 32).decode()


def write(folder: Path, text: str, name: str = "contentsvc.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def refusal(path: Path | None = None, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_configuration(path, environ or {})
    return str(caught.value)


@pytest.fixture(autouse=True)
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory: no ./contentsvc.toml leaks in; relative defaults land here."""
    folder = tmp_path / "cwd"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def test_defaults_without_a_file(cwd):
    configuration = load_configuration(None, {})
    settings = configuration.settings
    assert configuration.file is None
    assert settings.database_url is None
    assert settings.home == cwd.resolve() / ".contentsvc"
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert settings.change_retention_seconds == 7 * 86400
    assert settings.idle_checkpoint_seconds == 15
    assert (settings.max_blob_bytes, settings.upload_url_ttl_seconds) == (1024 ** 3, 3600)
    assert settings.blob_root == settings.home / "blobs"
    assert settings.search.engine_vectors is True and settings.search.backfill_chunk == 500
    # decisions-part2 "Startup configuration": the default of every part 2 key
    assert (settings.plugin_plan_poll, settings.pinned_plugin_attempts) == (2, 10)
    assert msgspec.structs.asdict(settings.deliveries) == {
        "retry_schedule": [0, 5, 300, 1800, 7200, 18000, 36000, 36000], "jitter": 0.1, "attempt_timeout_seconds": 15,
        "window_seconds": 259200, "max_retry_after_seconds": 36000, "concurrency": 8}
    connectors = msgspec.structs.asdict(settings.connectors)
    assert connectors.pop("credential_key") is None and connectors.pop("retired_credential_keys") == {}
    assert connectors == {
        "interval_floor_seconds": 30, "fixture_enabled": False, "credential_key_id": "k1", "public_base_url": None,
        "trusted_proxies": [], "push_rate_per_second": 10, "push_burst": 20, "idempotency_ttl_seconds": 86400,
        "max_pages_per_run": 100, "run_concurrency": 4, "fetch_timeout_seconds": 60}
    assert msgspec.structs.asdict(settings.monitoring) == {
        "evaluator_timeout_seconds": 10, "evaluation_concurrency": 4, "not_ready_max_seconds": 86400,
        "preview_timeout_seconds": 20}
    # docs/decisions.md "A slow or dead database": every wait on PostgreSQL is bounded
    database = settings.database
    assert (database.connect_timeout_seconds, database.pool_wait_seconds, database.unresponsive_seconds) == (2, 3, 7)
    assert (database.statement_timeout_ms, database.lock_timeout_ms, database.retry_after_seconds) == (5000, 4000, 2)


def test_the_file_sets_values_and_is_identified_by_its_sha256(tmp_path):
    path = write(tmp_path / "etc", """
database_url = "postgresql://db.example/contentsvc"
log_level = "debug"
plugin_plan_poll = 0.5
[api]
host = "0.0.0.0"
port = 9000
[changes]
retention_seconds = 3600
[deliveries]
retry_schedule = [0, 10]
[connectors]
interval_floor_seconds = 60
fixture_enabled = true
trusted_proxies = ["10.0.0.0/8", "fd00::/8"]
""")
    configuration = load_configuration(path, {})
    settings = configuration.settings
    assert settings.database_url == "postgresql://db.example/contentsvc"
    assert (settings.log_level, settings.plugin_plan_poll) == ("debug", 0.5)
    assert (settings.host, settings.port, settings.change_retention_seconds) == ("0.0.0.0", 9000, 3600)
    assert settings.deliveries.retry_schedule == [0, 10]
    assert settings.connectors.interval_floor_seconds == 60 and settings.connectors.fixture_enabled
    assert settings.connectors.trusted_proxies == ["10.0.0.0/8", "fd00::/8"]
    assert configuration.file.path == path.resolve()
    assert configuration.file.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_file_is_found_by_variable_or_in_the_working_directory(tmp_path, cwd):
    named = write(tmp_path / "elsewhere", "[api]\nport = 9001\n")
    assert load_settings(None, {"CONTENTSVC_CONFIG": str(named)}).port == 9001
    write(cwd, "[api]\nport = 9002\n")
    assert load_settings(None, {}).port == 9002
    # --config wins over the variable, the variable over the working directory's file
    assert load_settings(named, {"CONTENTSVC_CONFIG": str(cwd / "contentsvc.toml")}).port == 9001
    assert load_settings(None, {"CONTENTSVC_CONFIG": str(named)}).port == 9001


def test_the_environment_wins_over_the_file(tmp_path):
    path = write(tmp_path, "database_url = \"postgresql://file/db\"\n[api]\nport = 9000\nhost = \"0.0.0.0\"\n"
                           "[search]\nengine_vectors = true\n[connectors]\nfixture_enabled = false\n")
    environ = {"CONTENTSVC_PORT": "9100", "CONTENTSVC_DATABASE_URL": "postgresql://env/db",
               "CONTENTSVC_ENGINE_VECTORS": "0", "CONTENTSVC_FIXTURE_CONNECTOR": "1",
               "CONTENTSVC_CHANGE_RETENTION": "12h", "CONTENTSVC_UPLOAD_URL_TTL": "15m",
               "CONTENTSVC_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.0.0/16", "CONTENTSVC_PLUGIN_PLAN_POLL": "0.2",
               "CONTENTSVC_LOG_LEVEL": "WARNING", "CONTENTSVC_HOST": ""}  # empty = unset
    configuration = load_configuration(path, environ)
    settings = configuration.settings
    assert (settings.port, settings.database_url, settings.host) == (9100, "postgresql://env/db", "0.0.0.0")
    assert settings.search.engine_vectors is False and settings.connectors.fixture_enabled is True
    assert (settings.change_retention_seconds, settings.upload_url_ttl_seconds) == (12 * 3600, 900)
    assert settings.connectors.trusted_proxies == ["10.0.0.0/8", "192.168.0.0/16"]
    assert (settings.plugin_plan_poll, settings.log_level) == (0.2, "warning")
    assert configuration.from_environment[("api", "port")] == "CONTENTSVC_PORT"
    assert ("api", "host") not in configuration.from_environment


def test_unknown_keys_are_refused_with_their_path(tmp_path):
    assert refusal(write(tmp_path, "[connectors]\ninterval_floor = 30\n")) == \
        "connectors.interval_floor: unknown key"
    assert refusal(write(tmp_path, "listen = 1\n")) == "listen: unknown key"
    assert refusal(write(tmp_path, "[plugins.rss]\nendpoint = \"http://127.0.0.1:8093\"\nport = 1\n")) == \
        "plugins.rss.port: unknown key"


def test_wrong_types_and_ranges_name_the_key_and_what_it_accepts(tmp_path):
    cases = {
        "[connectors]\ninterval_floor_seconds = 0\n":
            "connectors.interval_floor_seconds: must be an integer from 1 to 86400",
        "[connectors]\ninterval_floor_seconds = \"30\"\n":
            "connectors.interval_floor_seconds: must be an integer from 1 to 86400",
        "[api]\nport = true\n": "api.port: must be an integer from 1 to 65535",
        "api = 8080\n": "api: must be a table",
        "plugin_plan_poll = 90\n": "plugin_plan_poll: must be a number from 0.2 to 60",
        "log_level = \"loud\"\n": 'log_level: must be one of "debug", "error", "info", "warning"',
        "[deliveries]\nretry_schedule = [0, -5]\n": "deliveries.retry_schedule[1]: must be an integer of at least 0",
        "[deliveries]\nretry_schedule = []\n": "deliveries.retry_schedule: must be an array of at least 1 and at most 100 items",
        "[search]\nengine_vectors = \"yes\"\n": "search.engine_vectors: must be true or false",
        "[search]\nmodel_dir = 3\n": "search.model_dir: must be a path (a string)",
        "[deliveries]\nwindow_seconds = 60\n":
            "deliveries.window_seconds: must be at least the sum of deliveries.retry_schedule (99305)",
        "[connectors]\ncredential_key = \"c2hvcnQ=\"\n": "connectors.credential_key: must be the base64 of 32 bytes",
        "[database]\nunresponsive_seconds = 0\n": "database.unresponsive_seconds: must be an integer from 1 to 60",
        "[database]\nunresponsive_seconds = 5\n":
            "database.unresponsive_seconds: must be more than database.statement_timeout_ms (5000 ms)",
        "[api]\npublic_base_url = \"svc.example:8080\"\n":
            "api.public_base_url: must be an absolute http(s) URL without a trailing slash",
        "[connectors]\npublic_base_url = \"https://svc.example/\"\n":
            "connectors.public_base_url: must be an absolute http(s) URL without a trailing slash",
        "[connectors]\ntrusted_proxies = [\"10.0.0.0/8\", \"proxy\"]\n":
            "connectors.trusted_proxies[1]: must be an IPv4 or IPv6 CIDR",
    }
    for text, message in cases.items():
        assert refusal(write(tmp_path, text)) == message, text


def test_a_bad_environment_value_names_the_key_and_the_variable():
    assert refusal(None, {"CONTENTSVC_PORT": "eighty"}) == \
        "api.port (from CONTENTSVC_PORT): must be an integer from 1 to 65535"
    assert refusal(None, {"CONTENTSVC_FIXTURE_CONNECTOR": "maybe"}) == \
        "connectors.fixture_enabled (from CONTENTSVC_FIXTURE_CONNECTOR): must be true or false"


def test_a_database_url_libpq_cannot_parse_is_refused_without_echoing_it():
    # It was a traceback from the first connect; the value may hold a password, so it is never shown.
    for url in ("notaurl", "postgresql://app:hunter2@[::1"):
        message = refusal(None, {"CONTENTSVC_DATABASE_URL": url})
        assert message == ("database_url (from CONTENTSVC_DATABASE_URL): must be a PostgreSQL connection URI "
                           "(postgresql://user@host:5432/dbname) or key=value string")
        assert "hunter2" not in message
    assert refusal(None, {"CONTENTSVC_TEST_DATABASE_URL": "notaurl"}).startswith("bench.admin_database_url")
    for url in ("postgresql://app@db:5432/content", "host=/run/postgresql dbname=content"):
        assert load_configuration(None, {"CONTENTSVC_DATABASE_URL": url}).settings.database_url == url


def test_an_explicitly_named_missing_file_stops_the_start(tmp_path):
    missing = tmp_path / "nowhere.toml"
    assert refusal(missing) == f"{missing}: no such configuration file (named by --config)"
    assert refusal(None, {"CONTENTSVC_CONFIG": str(missing)}) == \
        f"{missing}: no such configuration file (named by CONTENTSVC_CONFIG)"


def test_invalid_toml_names_the_file(tmp_path):
    path = write(tmp_path, "[connectors\n")
    assert refusal(path).startswith(f"{path}: invalid TOML: ")


def test_secrets_are_literals_or_read_from_the_named_variable(tmp_path):
    path = write(tmp_path, f"""
database_url = "env:DB_URL"
[connectors]
credential_key = "env:CREDENTIAL_KEY"
retired_credential_keys = {{ k0 = "{OLD_KEY}" }}
[client]
api_key = "csk_literal"
""")
    settings = load_settings(path, {"DB_URL": "postgresql://secret@db/x", "CREDENTIAL_KEY": KEY})
    assert settings.database_url == "postgresql://secret@db/x"
    assert settings.connectors.credential_key == KEY
    assert settings.connectors.retired_credential_keys == {"k0": OLD_KEY}
    assert settings.client.api_key == "csk_literal"
    # the environment's own override may name a variable too
    assert load_settings(None, {"CONTENTSVC_CREDENTIAL_KEY": "env:CREDENTIAL_KEY",
                                "CREDENTIAL_KEY": KEY}).connectors.credential_key == KEY


def test_a_secret_naming_an_unset_variable_stops_the_start(tmp_path):
    path = write(tmp_path, "[connectors]\ncredential_key = \"env:CREDENTIAL_KEY\"\n")
    assert refusal(path, {"CREDENTIAL_KEY": ""}) == \
        "connectors.credential_key: names the environment variable CREDENTIAL_KEY, which is not set"
    path = write(tmp_path, "[connectors.retired_credential_keys]\nk0 = \"env:OLD\"\n")
    assert refusal(path) == "connectors.retired_credential_keys.k0: names the environment variable OLD, which is not set"


def test_relative_paths_resolve_against_the_file_folder(tmp_path, cwd):
    folder = tmp_path / "deploy"
    path = write(folder, "home = \"state\"\n[search]\nmodel_dir = \"../models/minilm\"\n")
    settings = load_settings(path, {})
    assert settings.home == (folder / "state").resolve()
    assert settings.search.model_dir == (tmp_path / "models" / "minilm").resolve()
    assert load_settings(path, {"CONTENTSVC_HOME": "/srv/contentsvc"}).home == Path("/srv/contentsvc")
    # a relative path from the environment means what it always meant: the working directory's
    assert load_settings(path, {"CONTENTSVC_HOME": "here"}).home == (cwd / "here").resolve()


def test_config_check_masks_every_secret_and_prints_a_loadable_file(tmp_path):
    path = write(tmp_path, f"""
database_url = "postgresql://user:dbpassword@db/x"
[connectors]
credential_key = "env:CREDENTIAL_KEY"
retired_credential_keys = {{ k0 = "{OLD_KEY}" }}
interval_floor_seconds = 45
""")
    configuration = load_configuration(path, {"CREDENTIAL_KEY": KEY, "CONTENTSVC_API_KEY": "csk_fromenv"})
    text = render(configuration)
    for secret in ("dbpassword", KEY, OLD_KEY, "csk_fromenv"):
        assert secret not in text
    assert f"# sha256: {configuration.file.sha256}" in text
    printed = tomllib.loads(text)
    assert printed["database_url"] == "***"
    assert printed["connectors"]["credential_key"] == "***"
    assert printed["connectors"]["retired_credential_keys"] == {"k0": "***"}
    assert printed["client"]["api_key"] == "***"
    assert "# no configuration file" in render(load_configuration(None, {}))


def test_config_check_prints_the_effective_values_as_a_loadable_file(tmp_path):
    path = write(tmp_path, "home = \"state\"\n[api]\nport = 9000\n[deliveries]\nretry_schedule = [0, 60]\n")
    configuration = load_configuration(path, {"CONTENTSVC_CHANGE_RETENTION": "1d"})
    printed = write(tmp_path / "printed", render(configuration))
    assert load_settings(printed, {}) == configuration.settings


def test_settings_are_immutable():
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.api.port = 1


def test_the_public_base_url_is_configured_never_guessed(tmp_path):
    # The base of an Upload's put_url: api.public_base_url, else the deployment's
    # connectors.public_base_url (CONTENTSVC_PUBLIC_BASE_URL), else the address the API listens on.
    settings = load_configuration(write(tmp_path, "[api]\nport = 9000\n"), {}).settings
    assert settings.public_base_url() == "http://127.0.0.1:9000"
    assert settings.public_base_url("::1", 9001) == "http://[::1]:9001"  # serve --host/--port win
    settings = load_configuration(write(tmp_path, "[api]\nport = 9000\n"),
                                  {"CONTENTSVC_PUBLIC_BASE_URL": "https://svc.example"}).settings
    assert settings.public_base_url("127.0.0.1", 9000) == "https://svc.example"
    path = write(tmp_path, "[api]\npublic_base_url = \"https://api.example\"\n"
                           "[connectors]\npublic_base_url = \"https://hooks.example\"\n")
    settings = load_configuration(path, {}).settings
    assert settings.public_base_url("127.0.0.1", 9000) == "https://api.example"
    assert tomllib.loads(render(load_configuration(path, {})))["api"]["public_base_url"] == "https://api.example"
