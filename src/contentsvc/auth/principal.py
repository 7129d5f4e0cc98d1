"""Who is calling: the Organization, actions and Corpus scope of the key.

Derived from the key on every request (no cache: a revocation takes effect
on the next request).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from psycopg import AsyncConnection

from contentsvc.auth.keys import hash_secret
from contentsvc.domain.errors import ApiError, forbidden


@dataclass(frozen=True)
class Principal:
    key_id: str
    org_id: str
    actions: frozenset[str]
    corpora: frozenset[str] | None  # None: every Corpus of the Organization

    def may(self, action: str) -> bool:
        return action in self.actions

    def require(self, *actions: str) -> None:
        missing = [a for a in actions if a not in self.actions]
        if missing:
            raise forbidden(f"The API key lacks the action {missing[0]}.")

    def covers(self, corpus_id: str) -> bool:
        return self.corpora is None or corpus_id in self.corpora

    def require_corpus(self, corpus_id: str) -> None:
        """A Corpus named in the request that the scope excludes is 403."""
        if not self.covers(corpus_id):
            raise forbidden(f"The API key's Corpus scope does not include {corpus_id!r}.")

    def scope_digest(self) -> str:
        """Binds cursors to the key's authorization scope (not to the key)."""
        scope = "|".join(sorted(self.actions)) + "#" + (
            "*" if self.corpora is None else ",".join(sorted(self.corpora))
        )
        return hashlib.sha256(f"{self.org_id}#{scope}".encode()).hexdigest()[:16]


INVALID_KEY = ApiError(401, "invalid_api_key", "A valid API key is required (Authorization: Bearer <key>).")


def bearer_secret(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, secret = authorization.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()


async def load_principal(conn: AsyncConnection, secret: str) -> Principal | None:
    return await load_principal_by_hash(conn, hash_secret(secret))


async def load_principal_by_hash(conn: AsyncConnection, digest: bytes) -> Principal | None:
    """The live key whose secret hashes to `digest` (api_keys keeps only the hash)."""
    cur = await conn.execute(
        "SELECT key_id, org_id, actions, corpora FROM api_keys"
        " WHERE secret_hash = %s AND revoked_at IS NULL",
        (digest,),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    return Principal(
        key_id=row[0],
        org_id=row[1],
        actions=frozenset(row[2]),
        corpora=None if row[3] is None else frozenset(row[3]),
    )
