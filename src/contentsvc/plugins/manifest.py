"""The plugin manifest `contentsvc-plugin.json`: parsing, validation and its digest.

decisions-part2, "Manifest file": the file is validated by the meta-schema shipped
next to this module (JSON Schema 2020-12), every schema inside it must itself be a
valid 2020-12 schema, unknown members are refused, and each contribution needs at
least the plugin_api version that introduced it. The digest is over the exact bytes,
so a manifest is kept as bytes wherever it is pinned.

Every refusal names where it is, as a JSON Pointer into the manifest, so a
registration can answer 422 `invalid_plugin` with `field` `/manifest<pointer>` and a
startup configuration error can name the manifest file and member.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Literal

import msgspec

# The newest plugin API this engine speaks (part 2 "Versioning": declared routes 0.11,
# instance tokens and signatures 0.12).
ENGINE_PLUGIN_API = (0, 12)
MANIFEST_FILE = "contentsvc-plugin.json"
DEFAULT_CONFIGURATION_SCHEMA: dict = {"type": "object", "additionalProperties": False}


class ManifestIssue(msgspec.Struct, frozen=True):
    pointer: str  # RFC 6901, into the manifest; "" is the whole document
    message: str


class ManifestError(ValueError):
    """A manifest that cannot be pinned; `issues` lists every refusal, the first is the one to report."""

    def __init__(self, issues: list[ManifestIssue]):
        self.issues = issues
        first = issues[0]
        super().__init__(f"{first.pointer or '/'}: {first.message}")

    @property
    def pointer(self) -> str:
        return self.issues[0].pointer


# ---------------------------------------------------------------- the typed manifest


class Retry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_attempts: int = 3
    timeout_seconds: int = 30


class ExtensionDeclaration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    namespace: str
    schema_version: str
    schema: Any


class NormalizerContribution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    media_types: list[str]
    max_parts: int = 256
    extensions: list[ExtensionDeclaration] = []


class SubscriptionContribution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    expression_schema: Any
    configuration_schema: Any
    max_batch_size: int
    needs_enrichment: bool = False


class ConnectorLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_checkpoint_bytes: int = 65536
    max_pages_per_run: int = 100


class Attachments(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_bytes: int


class PushRoute(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    path: str
    methods: list[str]
    auth: Literal["service_key", "instance_token", "signature"]
    request_schema: Any
    signature_header: str | None = None
    timestamp_header: str | None = None
    window_seconds: int = 300


class Push(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    relay: bool = False
    routes: list[PushRoute] = []


class ConnectorKind(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kind: str
    description: str
    config_schema: Any
    credential: Literal["none", "optional", "required"]
    default_interval_seconds: int
    max_items: int
    credential_schema: Any = None
    limits: ConnectorLimits = ConnectorLimits()
    attachments: Attachments | None = None
    push: Push | None = None


class ConnectorContribution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kinds: list[ConnectorKind]


class Space(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    model: str
    dimensions: int
    metric: Literal["cosine", "dot", "l2"]
    modalities: list[str]


class IngestionContribution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    spaces: list[Space]
    source_formats: list[str]


class RetrievalProfile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    version: str
    modes: list[str]
    max_latency_ms: int
    max_query_chars: int


class RetrievalContribution(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    profiles: list[RetrievalProfile]


class Contributions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    normalizer: NormalizerContribution | None = None
    subscription: SubscriptionContribution | None = None
    connector: ConnectorContribution | None = None
    ingestion: IngestionContribution | None = None
    retrieval: RetrievalContribution | None = None

    def names(self) -> list[str]:
        """The contribution names declared, in the protocol's order (what discovery reports)."""
        return [name for name in CONTRIBUTION_NAMES if getattr(self, name) is not None]


CONTRIBUTION_NAMES = ("normalizer", "subscription", "connector", "ingestion", "retrieval")


class Manifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    manifest_version: int
    id: str
    version: str
    plugin_api: str
    title: str
    contributions: Contributions
    description: str | None = None
    configuration_schema: Any = msgspec.field(default_factory=lambda: dict(DEFAULT_CONFIGURATION_SCHEMA))
    retry: Retry = Retry()

    @property
    def plugin_api_version(self) -> tuple[int, int]:
        return parse_plugin_api(self.plugin_api)


class PinnedManifest(msgspec.Struct, frozen=True):
    """A manifest with the exact bytes it was read from: what a registration pins."""

    manifest: Manifest
    raw: bytes
    digest: str


# ---------------------------------------------------------------- parsing


def manifest_digest(raw: bytes) -> str:
    """Lowercase hex sha256 over the manifest file's exact bytes (decisions-part2)."""
    return hashlib.sha256(raw).hexdigest()


def parse_plugin_api(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def format_plugin_api(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def pointer(*segments: str | int) -> str:
    """An RFC 6901 JSON Pointer from path segments."""
    return "".join("/" + str(s).replace("~", "~0").replace("/", "~1") for s in segments)


@cache
def meta_schema() -> dict:
    text = resources.files("contentsvc.plugins").joinpath("manifest.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


# jsonschema is imported where it is used: most processes read manifests only from the registry
# and never validate one, and the import is a fifth of a worker's start.
@cache
def _meta_validator():
    from jsonschema import Draft202012Validator

    return Draft202012Validator(meta_schema())


def parse_manifest(raw: bytes) -> PinnedManifest:
    """The manifest from its file's bytes, or ManifestError naming every refusal."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError([ManifestIssue("", f"not UTF-8 (byte {exc.start})")]) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ManifestError([ManifestIssue("", f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")]) \
            from None
    issues = validate_document(document)
    if issues:
        raise ManifestError(issues)
    try:
        manifest = msgspec.convert(document, Manifest)
    except msgspec.ValidationError as exc:  # the meta-schema and the Structs disagree: still a refusal
        raise ManifestError([ManifestIssue("", str(exc))]) from None
    return PinnedManifest(manifest=manifest, raw=raw, digest=manifest_digest(raw))


@lru_cache(maxsize=64)
def stored_manifest(text: str) -> PinnedManifest:
    """A registration's manifest as the registry keeps it, parsed once per process: registrations
    are immutable, and checking a manifest against the meta-schema and its embedded schemas took
    about 2 ms of CPU, paid on every subscription preview (twice) and every plan loaded."""
    return parse_manifest(text.encode("utf-8"))


def validate_document(document: object) -> list[ManifestIssue]:
    """Every refusal of a decoded manifest, in document order; empty when it may be pinned."""
    errors = sorted(_meta_validator().iter_errors(document), key=lambda e: (list(map(str, e.absolute_path)),
                                                                            e.message))
    if errors:
        return [ManifestIssue(_error_pointer(error), error.message) for error in errors]
    assert isinstance(document, dict)
    return [*_embedded_schema_issues(document), *_plugin_api_issues(document), *_uniqueness_issues(document)]


def _error_pointer(error) -> str:
    """Where a meta-schema error is: an unknown or missing member is named itself, not its object."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        declared = error.schema.get("properties", {})
        unknown = sorted(k for k in error.instance if k not in declared)
        if unknown:
            return pointer(*path, unknown[0])
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        if missing:
            return pointer(*path, missing[0])
    return pointer(*path)


def _embedded_schemas(document: dict) -> list[tuple[tuple[str | int, ...], object]]:
    found: list[tuple[tuple[str | int, ...], object]] = []
    if "configuration_schema" in document:
        found.append((("configuration_schema",), document["configuration_schema"]))
    contributions = document["contributions"]
    for n, extension in enumerate(contributions.get("normalizer", {}).get("extensions", [])):
        found.append((("contributions", "normalizer", "extensions", n, "schema"), extension["schema"]))
    if "subscription" in contributions:
        for member in ("expression_schema", "configuration_schema"):
            found.append((("contributions", "subscription", member), contributions["subscription"][member]))
    for k, kind in enumerate(contributions.get("connector", {}).get("kinds", [])):
        base = ("contributions", "connector", "kinds", k)
        for member in ("config_schema", "credential_schema"):
            if member in kind:
                found.append(((*base, member), kind[member]))
        for r, route in enumerate(kind.get("push", {}).get("routes", [])):
            found.append(((*base, "push", "routes", r, "request_schema"), route["request_schema"]))
    return found


def _embedded_schema_issues(document: dict) -> list[ManifestIssue]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    issues = []
    for path, schema in _embedded_schemas(document):
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            where = pointer(*path, *exc.absolute_path)
            issues.append(ManifestIssue(where, f"not a valid JSON Schema 2020-12: {exc.message}"))
    return issues


def required_plugin_api(document: dict) -> list[tuple[tuple[str | int, ...], tuple[int, int], str]]:
    """(where, minimum plugin_api, what) for each feature the manifest uses (decisions-part2)."""
    contributions = document["contributions"]
    needs: list[tuple[tuple[str | int, ...], tuple[int, int], str]] = []
    if "subscription" in contributions:
        needs.append((("contributions", "subscription"), (0, 2), "a subscription contribution"))
    if "connector" in contributions:
        needs.append((("contributions", "connector"), (0, 3), "a connector contribution"))
        for k, kind in enumerate(contributions["connector"]["kinds"]):
            base = ("contributions", "connector", "kinds", k)
            if "attachments" in kind:
                needs.append(((*base, "attachments"), (0, 4), "attachments"))
            push = kind.get("push", {})
            if push.get("relay"):
                needs.append(((*base, "push", "relay"), (0, 5), "the webhook relay"))
            for r, route in enumerate(push.get("routes", [])):
                needs.append(((*base, "push", "routes", r), (0, 11), "declared push routes"))
                if route["auth"] in ("instance_token", "signature"):
                    needs.append(((*base, "push", "routes", r, "auth"), (0, 12), f"auth {route['auth']}"))
    if "ingestion" in contributions:
        needs.append((("contributions", "ingestion"), (0, 6), "an ingestion contribution"))
    if "retrieval" in contributions:
        needs.append((("contributions", "retrieval"), (0, 7), "a retrieval contribution"))
    return needs


def _plugin_api_issues(document: dict) -> list[ManifestIssue]:
    declared = parse_plugin_api(document["plugin_api"])
    if declared > ENGINE_PLUGIN_API or declared[0] != ENGINE_PLUGIN_API[0]:
        return [ManifestIssue("/plugin_api", f"plugin_api {document['plugin_api']} is not supported "
                                             f"(this engine speaks {format_plugin_api(ENGINE_PLUGIN_API)} or lower)")]
    return [ManifestIssue(pointer(*where), f"{what} needs plugin_api {format_plugin_api(minimum)} or later, "
                                           f"the manifest declares {document['plugin_api']}")
            for where, minimum, what in required_plugin_api(document) if declared < minimum]


def _uniqueness_issues(document: dict) -> list[ManifestIssue]:
    """Names that identify something (a connector kind, a push route, a space, a profile) appear once."""
    contributions = document["contributions"]
    lists: list[tuple[tuple[str | int, ...], list, str]] = [
        (("contributions", "normalizer", "extensions"), contributions.get("normalizer", {}).get("extensions", []),
         "namespace"),
        (("contributions", "connector", "kinds"), contributions.get("connector", {}).get("kinds", []), "kind"),
        (("contributions", "ingestion", "spaces"), contributions.get("ingestion", {}).get("spaces", []), "name"),
        (("contributions", "retrieval", "profiles"), contributions.get("retrieval", {}).get("profiles", []), "name"),
    ]
    for k, kind in enumerate(contributions.get("connector", {}).get("kinds", [])):
        lists.append((("contributions", "connector", "kinds", k, "push", "routes"),
                      kind.get("push", {}).get("routes", []), "name"))
    issues = []
    for base, items, member in lists:
        seen: set[str] = set()
        for n, item in enumerate(items):
            if item[member] in seen:
                issues.append(ManifestIssue(pointer(*base, n, member), f"{member} {item[member]!r} appears twice"))
            seen.add(item[member])
    return issues


@lru_cache(maxsize=256)
def _validator(encoded_schema: bytes):
    """A schema's validator, built once: building one is most of checking a small instance (a push
    route's body is checked against its request_schema on every push)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(msgspec.json.decode(encoded_schema))


def validate_against(schema: object, instance: object) -> list[ManifestIssue]:
    """An instance (plugin configuration, an expression, a fixture) against a schema the manifest declares;
    pointers are into the instance."""
    errors = sorted(_validator(msgspec.json.encode(schema)).iter_errors(instance),
                    key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [ManifestIssue(pointer(*error.absolute_path), error.message) for error in errors]


# ---------------------------------------------------------------- installed settings


class RouteSetting(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    media_type: str
    optional: bool = False


class InstalledSettings(msgspec.Struct, frozen=True):
    """What an operator installs a plugin with (decisions-part2 `[plugins.<id>]` and the registration's
    `settings`): its configuration, and which declared routes, kinds and spaces it serves."""

    configuration: dict
    routes: list[RouteSetting]
    kinds: list[str]
    spaces: list[str]


class SettingsError(ValueError):
    """Settings the manifest does not allow; `pointer` is into the settings object."""

    def __init__(self, pointer: str, message: str):
        super().__init__(f"{pointer or '/'}: {message}")
        self.pointer = pointer
        self.message = message


def installed_settings(manifest: Manifest, raw: dict | None) -> InstalledSettings:
    """Settings with their defaults (every declared route, kind and space), checked against the manifest:
    configuration valid against `configuration_schema`, routes, kinds and spaces declared by it."""
    raw = dict(raw or {})
    unknown = sorted(set(raw) - {"configuration", "routes", "kinds", "spaces"})
    if unknown:
        raise SettingsError(pointer(unknown[0]), "unknown setting")
    configuration = raw.get("configuration", {})
    if not isinstance(configuration, dict):
        raise SettingsError("/configuration", "must be a table (object)")
    issues = validate_against(manifest.configuration_schema, configuration)
    if issues:
        raise SettingsError("/configuration" + issues[0].pointer, issues[0].message)

    contributions = manifest.contributions
    declared_types = contributions.normalizer.media_types if contributions.normalizer else []
    routes_raw = raw.get("routes", [{"media_type": media_type} for media_type in declared_types])
    if not isinstance(routes_raw, list):
        raise SettingsError("/routes", "must be an array of {media_type, optional}")
    routes = []
    for n, entry in enumerate(routes_raw):
        try:
            route = msgspec.convert(entry, RouteSetting)
        except msgspec.ValidationError as exc:
            raise SettingsError(pointer("routes", n), str(exc)) from None
        if route.media_type not in declared_types:
            raise SettingsError(pointer("routes", n, "media_type"),
                                f"{route.media_type!r} is not a media type the manifest's normalizer declares")
        if route.media_type in (r.media_type for r in routes):
            raise SettingsError(pointer("routes", n, "media_type"), f"{route.media_type!r} appears twice")
        routes.append(route)

    declared_kinds = [kind.kind for kind in contributions.connector.kinds] if contributions.connector else []
    declared_spaces = [space.name for space in contributions.ingestion.spaces] if contributions.ingestion else []
    kinds = _declared_names(raw, "kinds", declared_kinds, "connector kind")
    spaces = _declared_names(raw, "spaces", declared_spaces, "ingestion space")
    return InstalledSettings(configuration=configuration, routes=routes, kinds=kinds, spaces=spaces)


def _declared_names(raw: dict, member: str, declared: list[str], what: str) -> list[str]:
    names = raw.get(member, list(declared))
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise SettingsError(pointer(member), "must be an array of strings")
    for n, name in enumerate(names):
        if name not in declared:
            raise SettingsError(pointer(member, n), f"{name!r} is not a {what} the manifest declares")
        if name in names[:n]:
            raise SettingsError(pointer(member, n), f"{name!r} appears twice")
    return names


def roles(manifest: Manifest, settings: InstalledSettings) -> list[str]:
    """The roles a registration serves (decisions-part2 "Registration request"), sorted."""
    found = [f"normalizer:{route.media_type}" for route in settings.routes]
    if manifest.contributions.subscription is not None:
        found.append(f"subscription:{manifest.id}")
    found += [f"connector:{kind}" for kind in settings.kinds]
    found += [f"ingestion:{space}" for space in settings.spaces]
    if manifest.contributions.retrieval is not None:
        found += [f"retrieval:{profile.name}" for profile in manifest.contributions.retrieval.profiles]
    return sorted(found)
