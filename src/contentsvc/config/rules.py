"""Startup rules a key's type cannot say: formats of strings and bounds across keys
(decisions-part2, "Startup configuration")."""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from contentsvc.config.settings import Settings

CREDENTIAL_KEY_BYTES = 32


def _is_base64_key(value: str) -> bool:
    try:
        return len(base64.b64decode(value, validate=True)) == CREDENTIAL_KEY_BYTES
    except (binascii.Error, ValueError):
        return False


def _is_http_url(value: str) -> bool:
    try:
        parts = urlsplit(value)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _is_conninfo(value: str) -> bool:
    """Whether libpq parses it (a URI or key=value pairs); nothing is connected to."""
    try:
        conninfo_to_dict(value)
    except psycopg.ProgrammingError:
        return False
    return True


def problems(settings: Settings) -> Iterator[tuple[str, str]]:
    """(key path, problem) for every broken rule, in key order."""
    for key, url in (("database_url", settings.database_url), ("bench.admin_database_url",
                                                               settings.bench.admin_database_url)):
        if url is not None and not _is_conninfo(url):
            # Never the value, nor libpq's message quoting it: it may hold a password.
            yield key, "must be a PostgreSQL connection URI (postgresql://user@host:5432/dbname) or key=value string"

    for key, url in (("api.public_base_url", settings.api.public_base_url),
                     ("connectors.public_base_url", settings.connectors.public_base_url)):
        if url is not None and (not _is_http_url(url) or url.endswith("/")):
            yield key, "must be an absolute http(s) URL without a trailing slash"

    if settings.client.url is not None and not _is_http_url(settings.client.url):
        yield "client.url", "must be an absolute http(s) URL"

    database = settings.database
    if database.unresponsive_seconds * 1000 <= database.statement_timeout_ms:
        # A slow but live server must answer its own statement_timeout (57014, a clean
        # 503) before the client gives up on it and closes the connection.
        yield ("database.unresponsive_seconds",
               f"must be more than database.statement_timeout_ms ({database.statement_timeout_ms} ms)")

    deliveries = settings.deliveries
    if deliveries.window_seconds < sum(deliveries.retry_schedule):
        yield ("deliveries.window_seconds",
               f"must be at least the sum of deliveries.retry_schedule ({sum(deliveries.retry_schedule)})")

    connectors = settings.connectors
    key_problem = f"must be the base64 of {CREDENTIAL_KEY_BYTES} bytes"
    if connectors.credential_key is not None and not _is_base64_key(connectors.credential_key):
        yield "connectors.credential_key", key_problem
    for key_id, key in connectors.retired_credential_keys.items():
        if not _is_base64_key(key):
            yield f"connectors.retired_credential_keys.{key_id}", key_problem
    for index, cidr in enumerate(connectors.trusted_proxies):
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            yield f"connectors.trusted_proxies[{index}]", "must be an IPv4 or IPv6 CIDR"
