"""The `[plugins.<plugin_id>]` and `[destinations.<destination_id>]` tables checked beyond their
types (decisions-part2, "Startup configuration"): each plugin's manifest is read and pinned,
its id and version must equal the manifest's, its configuration must satisfy the manifest's
configuration_schema, its routes, kinds and spaces must be declared by the manifest, and the
plugins together keep the startup rules (one normalizer per media type, one provider per
connector kind, per ingestion space and per retrieval profile, one declarer per extension
namespace, one ingestion plugin per source format). Every problem names the TOML key path.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec

from contentsvc.config.settings import DestinationSettings, PluginSettings, Settings
from contentsvc.plugins.manifest import (
    InstalledSettings,
    ManifestError,
    PinnedManifest,
    SettingsError,
    installed_settings,
    parse_manifest,
    roles,
)
from contentsvc.plugins.planning import candidate_of, declaration_conflicts

MAX_DESTINATION_HEADERS = 16
RESERVED_HEADERS = ("content-type", "content-length", "host")
WEBHOOK_SECRET_PREFIX = "whsec_"


@dataclass(frozen=True)
class PinnedPlugin:
    """A plugin as the startup configuration pins it: the manifest bytes read at start, the
    installed settings with their defaults, the roles it serves."""

    plugin_id: str
    entry: PluginSettings
    pinned: PinnedManifest
    settings: InstalledSettings
    roles: list[str]


def dotted(prefix: str, json_pointer: str) -> str:
    """A key path from a JSON Pointer into a table: /routes/0/media_type -> routes[0].media_type."""
    out = prefix
    for segment in json_pointer.split("/")[1:] if json_pointer else []:
        segment = segment.replace("~1", "/").replace("~0", "~")
        out += f"[{segment}]" if segment.isdigit() else f".{segment}"
    return out


PORT_RANGE = " (its port, when given, from 1 to 65535)"


def _http_url(value: str) -> tuple[str, str, int | None] | None:
    """(scheme, host, explicit port or None) of an absolute http(s) URL, else None (port 0 included:
    nothing can be reached there)."""
    try:
        parts = urlsplit(value)
        port = parts.port  # a port that is no number, or over 65535, raises here
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return None
    return parts.scheme, parts.hostname, port


def is_loopback(host: str) -> bool:
    """A loopback host name or address (plugins and destinations may then speak plain http)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_plugins(settings: Settings) -> tuple[dict[str, PinnedPlugin], list[tuple[str, str]]]:
    """Every pinned plugin, and (key path, problem) for each refusal, in key order."""
    pinned: dict[str, PinnedPlugin] = {}
    problems: list[tuple[str, str]] = []
    for plugin_id, entry in settings.plugins.items():
        where = f"plugins.{plugin_id}"
        found = list(_plugin_problems(plugin_id, entry))
        if found:
            problems += [(f"{where}{suffix}", problem) for suffix, problem in found]
            continue
        raw_manifest = entry.manifest.read_bytes()
        manifest = parse_manifest(raw_manifest)
        try:
            installed = installed_settings(manifest.manifest, _settings_of(entry))
        except SettingsError as exc:
            problems.append((dotted(where, exc.pointer), exc.message))
            continue
        pinned[plugin_id] = PinnedPlugin(plugin_id, entry, manifest, installed, roles(manifest.manifest, installed))
    problems += list(_startup_rules(pinned))
    return pinned, problems


def _settings_of(entry: PluginSettings) -> dict:
    raw: dict = {"configuration": entry.configuration}
    if entry.routes is not None:
        raw["routes"] = msgspec.to_builtins(entry.routes)
    if entry.kinds is not None:
        raw["kinds"] = entry.kinds
    if entry.spaces is not None:
        raw["spaces"] = entry.spaces
    return raw


def _plugin_problems(plugin_id: str, entry: PluginSettings) -> Iterator[tuple[str, str]]:
    endpoint = _http_url(entry.endpoint)
    if endpoint is None:
        yield ".endpoint", f"must be an absolute http(s) URL{PORT_RANGE}"
        return
    try:
        raw = entry.manifest.read_bytes()
    except OSError as exc:
        yield ".manifest", f"cannot read {entry.manifest}: {exc.strerror}"
        return
    try:
        manifest = parse_manifest(raw).manifest
    except ManifestError as exc:
        yield ".manifest", f"{entry.manifest} is not a valid plugin manifest: {exc}"
        return
    if manifest.id != plugin_id:
        yield "", f"the manifest's id is {manifest.id!r}: the table must be [plugins.{manifest.id}]"
    if manifest.version != entry.version:
        yield ".version", f"must equal the manifest's version {manifest.version!r}"
    if entry.launch is not None:
        if entry.launch != plugin_id:
            yield ".launch", f"starts the first-party plugin {entry.launch}, whose id is not {plugin_id!r}"
        elif endpoint[0] != "http" or not is_loopback(endpoint[1]) or endpoint[2] is None:
            # the port is the one `plugin serve` is started on: it must be written, not implied
            yield ".launch", "a launched plugin listens on loopback: the endpoint must be http://127.0.0.1:<port>"


_TABLE_SETTINGS = ("routes", "kinds", "spaces")  # startup rule settings the [plugins.<id>] table names


def _startup_rules(pinned: dict[str, PinnedPlugin]) -> Iterator[tuple[str, str]]:
    """The startup rules an activation keeps too (part 2 "Activation rules"), by the same function
    (plugins/planning.py): one plugin per role (a media type, a connector kind, an ingestion space,
    a retrieval profile), per extension namespace and per ingestion source format. A break is named
    at the table key that chose it (routes, kinds, spaces), else at the manifest that declares it."""
    members = [candidate_of(plugin_id, plugin.pinned.manifest, plugin.roles) for plugin_id, plugin in pinned.items()]
    for conflict in declaration_conflicts(members):
        setting = conflict.setting if conflict.setting in _TABLE_SETTINGS else "manifest"
        yield f"plugins.{conflict.member}.{setting}", f"{conflict.what} is already served by plugin {conflict.other}"


_SECRET_BYTES = (24, 64)


def _webhook_secret(value: str) -> bool:
    if not value.startswith(WEBHOOK_SECRET_PREFIX):
        return False
    try:
        decoded = base64.b64decode(value[len(WEBHOOK_SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        return False
    return _SECRET_BYTES[0] <= len(decoded) <= _SECRET_BYTES[1]


# An HTTP field name (RFC 9110 token); call fullmatch (a `$` would let a trailing newline through).
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# A field value of RFC 9110 in printable ASCII: no control character (a line break would end the
# header), no leading or trailing space, nothing a receiver would have to guess the encoding of.
HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


def destination_problems(settings: Settings) -> Iterator[tuple[str, str]]:
    for destination_id, entry in settings.destinations.items():
        yield from ((f"destinations.{destination_id}{suffix}", problem)
                    for suffix, problem in _destination_problems(entry))


def _destination_problems(entry: DestinationSettings) -> Iterator[tuple[str, str]]:
    url = _http_url(entry.url)
    if url is None:
        yield ".url", f"must be an absolute https URL{PORT_RANGE}"
    elif url[0] == "http" and not (is_loopback(url[1]) or entry.allow_http):
        yield ".url", "must be an https URL (http only for a loopback host or with allow_http = true)"
    elif "@" in urlsplit(entry.url).netloc:
        yield ".url", "may not hold a user name or password: put the receiver's credentials in headers"
    secret_problem = f"must be {WEBHOOK_SECRET_PREFIX} followed by the base64 of {_SECRET_BYTES[0]} to " \
                     f"{_SECRET_BYTES[1]} bytes"
    if not _webhook_secret(entry.secret):
        yield ".secret", secret_problem
    if entry.previous_secret is not None and not _webhook_secret(entry.previous_secret):
        yield ".previous_secret", secret_problem
    if len(entry.headers) > MAX_DESTINATION_HEADERS:
        yield ".headers", f"at most {MAX_DESTINATION_HEADERS} headers"
    for name in entry.headers:
        lowered = name.lower()
        if not HEADER_NAME.fullmatch(name):
            yield f".headers.{name}", "is not a valid header name"
        elif lowered in RESERVED_HEADERS or lowered.startswith("webhook-"):
            yield f".headers.{name}", "may not be set: the delivery sets it"
        elif not HEADER_VALUE.fullmatch(entry.headers[name]):
            yield f".headers.{name}", "must be printable ASCII, without line breaks or surrounding spaces"
