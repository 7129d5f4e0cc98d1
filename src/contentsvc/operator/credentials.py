"""`contentsvc credentials rewrap` (decisions-part2 "Credentials", "Operator CLI additions"): every
deposited Connector credential sealed again under the current `[connectors] credential_key`, so a
retired key can then be dropped from `retired_credential_keys`. Each Connector is rewrapped in its
own transaction under a row lock; one already under the current key is left alone, so the command
may be stopped and run again. Nothing of a secret is printed or logged."""

from __future__ import annotations

import sys

from psycopg.types.json import Jsonb

from contentsvc.config import Settings
from contentsvc.connectors.credentials import open_credential, seal_credential
from contentsvc.storage import sealed
from contentsvc.storage.database import connect


def rewrap(url: str, settings: Settings) -> int:
    if not sealed.can_seal(settings):
        print("error: no [connectors] credential_key is configured: nothing to seal under", file=sys.stderr)
        return 2
    current = settings.connectors.credential_key_id
    rewrapped = unreadable = 0
    # Durable before it reports: the operator drops the retired key on the strength of the report.
    with connect(url) as conn:
        ids = [r[0] for r in conn.execute("SELECT connector_id FROM connectors WHERE credential IS NOT NULL"
                                          " AND credential->>'key_id' <> %s ORDER BY connector_id", (current,))]
        conn.commit()
        for connector_id in ids:
            with conn.transaction():
                row = conn.execute("SELECT credential, credential_version FROM connectors WHERE connector_id = %s"
                                   " FOR UPDATE", (connector_id,)).fetchone()
                stored, version = row
                if stored is None or stored.get("key_id") == current:
                    continue
                try:
                    secret = open_credential(settings, connector_id, version, stored)
                except sealed.Unreadable:
                    unreadable += 1
                    print(f"{connector_id}: no configured key opens it (key id {stored.get('key_id')!r})",
                          file=sys.stderr)
                    continue
                conn.execute("UPDATE connectors SET credential = %s WHERE connector_id = %s",
                             (Jsonb(seal_credential(settings, connector_id, version, secret)), connector_id))
                rewrapped += 1
    print(f"rewrapped {rewrapped} credential(s) under key {current!r}; {unreadable} unreadable")
    return 1 if unreadable else 0
