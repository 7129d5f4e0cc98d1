"""The Principals of the keys an API process has seen, so that a request does not read its key
(storage/notified_cache.py: how a change still takes effect on the next request).

Every change to `api_keys` is announced on KEYS_CHANNEL (schema/024, a trigger), and the API's
listening connection clears the cache when one arrives; `keys revoke` returns only after its
own copy of the announcement is back and a grace of 50 ms.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from contentsvc.auth.keys import hash_secret
from contentsvc.auth.principal import Principal
from contentsvc.storage.notified_cache import NotifiedCache

MAX_ENTRIES = 10_000  # keys; past it the cache starts again empty (keys are few, secrets guessed are never cached)


class PrincipalCache(NotifiedCache[bytes, Principal]):
    def __init__(self) -> None:
        super().__init__(MAX_ENTRIES)

    async def principal(self, secret: str,
                        read: Callable[[bytes], Awaitable[Principal | None]]) -> Principal | None:
        """The key's Principal (None for no valid key); `read` reads it from the database by the
        secret's hash."""
        return await self.get(hash_secret(secret), read)
