"""A Connector's deposited credential (decisions-part2, "Credentials"): sealed with AES-256-GCM
under the credential key, associated data `connector_id:version`, so a ciphertext cannot be
moved to another Connector or replayed as another version. Opened only in memory, for a plugin
call; never logged, returned or journaled in clear."""

from __future__ import annotations

import msgspec

from contentsvc.config import Settings
from contentsvc.domain.errors import ApiError
from contentsvc.storage import sealed


def credentials_unavailable() -> ApiError:
    return ApiError(503, "credentials_unavailable", "This deployment accepts no credential deposits: no "
                    "[connectors] credential_key is configured.", retryable=False)


def _associated(connector_id: str, version: int) -> bytes:
    return f"{connector_id}:{version}".encode()


def seal_credential(settings: Settings, connector_id: str, version: int, secret: dict) -> dict[str, str]:
    if not sealed.can_seal(settings):
        raise credentials_unavailable()
    return sealed.seal(settings, msgspec.json.encode(secret), _associated(connector_id, version))


def open_credential(settings: Settings, connector_id: str, version: int, stored: dict | None) -> dict | None:
    """The secret object, or None when none was deposited. Raises sealed.Unreadable when no
    configured key opens it."""
    if stored is None:
        return None
    return msgspec.json.decode(sealed.unseal(settings, stored, _associated(connector_id, version)))
