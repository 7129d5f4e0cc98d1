"""The Principals of the keys an API process has seen, so that a request does not read its key.

A revocation must still take effect on the next request. Every change to `api_keys` is
announced on KEYS_CHANNEL (schema/024, a trigger), and the API's listening connection clears
the cache when one arrives, normally within a millisecond of the commit; `keys revoke`
returns only after its own copy of the announcement is back and a grace of 50 ms. The cache
serves only while that connection is listening: from its loss until it listens again (and
clears once more, for changes announced meanwhile), every request reads its key from the
database.

A request that read its key from the database before a clear must not put the stale Principal
back afterwards: it remembers the cache's epoch before reading, and stores only if no clear
happened since.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from contentsvc.auth.keys import hash_secret
from contentsvc.auth.principal import Principal

MAX_ENTRIES = 10_000  # keys; past it the cache starts again empty (keys are few, secrets guessed are never cached)


class PrincipalCache:
    def __init__(self) -> None:
        self._by_hash: dict[bytes, Principal] = {}
        self._epoch = 0
        self.listening = False

    def clear(self) -> None:
        self._epoch += 1
        self._by_hash = {}

    def listening_started(self) -> None:
        self.clear()
        self.listening = True

    def listening_lost(self) -> None:
        self.listening = False
        self.clear()

    async def principal(self, secret: str,
                        read: Callable[[bytes], Awaitable[Principal | None]]) -> Principal | None:
        """The key's Principal (None for no valid key); `read` reads it from the database by the
        secret's hash."""
        digest = hash_secret(secret)
        if self.listening and (cached := self._by_hash.get(digest)) is not None:
            return cached
        epoch = self._epoch
        principal = await read(digest)
        if principal is not None and self.listening and epoch == self._epoch:
            if len(self._by_hash) >= MAX_ENTRIES:
                self._by_hash = {}
            self._by_hash[digest] = principal
        return principal
