"""Deposited credentials at rest (decisions-part2 "Credentials"): AES-256-GCM with associated data
`connector_id:version`, opened by key id among the current and retired keys, and
`contentsvc credentials rewrap` moving every one to the current key, against a real PostgreSQL."""

from __future__ import annotations

import base64
import os
import uuid
from datetime import datetime, timezone

import psycopg
import pytest
from psycopg.types.json import Jsonb

from contentsvc.config import Settings
from contentsvc.config.settings import ConnectorSettings
from contentsvc.connectors.credentials import open_credential, seal_credential
from contentsvc.domain.errors import ApiError
from contentsvc.operator.credentials import rewrap
from contentsvc.storage import sealed

OLD, NEW = base64.b64encode(os.urandom(32)).decode(), base64.b64encode(os.urandom(32)).decode()
SECRET = {"username": "harbour", "password": "correct horse battery staple"}


def settings(url: str | None = None, **connectors) -> Settings:
    return Settings(database_url=url, connectors=ConnectorSettings(**connectors))


def test_a_sealed_credential_opens_only_for_its_connector_and_version():
    s = settings(credential_key=OLD, credential_key_id="k0")
    stored = seal_credential(s, "con_1", 1, SECRET)
    assert stored["key_id"] == "k0" and SECRET["password"] not in str(stored)
    assert open_credential(s, "con_1", 1, stored) == SECRET
    for connector_id, version in (("con_2", 1), ("con_1", 2)):  # moved or replayed: refused
        with pytest.raises(sealed.Unreadable):
            open_credential(s, connector_id, version, stored)
    rotated = settings(credential_key=NEW, credential_key_id="k1", retired_credential_keys={"k0": OLD})
    assert open_credential(rotated, "con_1", 1, stored) == SECRET  # a retired key still opens
    with pytest.raises(sealed.Unreadable):
        open_credential(settings(credential_key=NEW, credential_key_id="k1"), "con_1", 1, stored)


def test_without_a_key_deposits_are_503_credentials_unavailable():
    with pytest.raises(ApiError) as refused:
        seal_credential(settings(), "con_1", 1, SECRET)
    assert (refused.value.status, refused.value.code) == (503, "credentials_unavailable")


def test_rewrap_moves_every_credential_to_the_current_key(databases, capsys):
    url = databases.create()
    old = settings(url, credential_key=OLD, credential_key_id="k0")
    now = datetime.now(timezone.utc)
    ids = [f"con_{uuid.uuid4().hex[:8]}" for _ in range(3)]
    with psycopg.connect(url) as conn:
        for n, connector_id in enumerate(ids):
            conn.execute(
                "INSERT INTO connectors (connector_id, org_id, corpus_id, source_namespace, kind, config,"
                " interval_seconds, health_policy, created_at, health, credential, credential_version)"
                " VALUES (%s, 'org', 'c', %s, 'fixture', '{}', 300, '{}', %s, '{}', %s, %s)",
                (connector_id, f"ns{n}", now, Jsonb(seal_credential(old, connector_id, n + 1, SECRET)), n + 1))
    new = settings(url, credential_key=NEW, credential_key_id="k1", retired_credential_keys={"k0": OLD})
    assert rewrap(url, new) == 0
    assert "rewrapped 3" in capsys.readouterr().out
    current_only = settings(url, credential_key=NEW, credential_key_id="k1")  # the old key can now go
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT connector_id, credential, credential_version FROM connectors").fetchall()
    assert {r[1]["key_id"] for r in rows} == {"k1"}
    assert all(open_credential(current_only, r[0], r[2], r[1]) == SECRET for r in rows)
    assert rewrap(url, new) == 0 and "rewrapped 0" in capsys.readouterr().out  # idempotent
