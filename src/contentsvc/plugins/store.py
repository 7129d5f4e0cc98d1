"""What a registration keeps outside the journal, under `home/plugins/<registration_id>/`:
its fixture files (`fixtures/<path>`, read by the contract check) and its token (`token.json`).

The token is encrypted like connector credentials (decisions-part2, "Credentials": AES-256-GCM,
a 12-byte random nonce, associated data naming what it protects, stored as `{key_id, nonce,
ciphertext}`) when `[connectors] credential_key` is configured; otherwise it is stored plain
(`{plain}`) in a file of mode 0600. Either way the file is written to a temporary name, fsynced
and renamed, and never logged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

from contentsvc.config import Settings
from contentsvc.storage import sealed

TOKEN_FILE = "token.json"


def registration_folder(home: Path, registration_id: str) -> Path:
    return home / "plugins" / registration_id


def fixtures_folder(home: Path, registration_id: str) -> Path:
    return registration_folder(home, registration_id) / "fixtures"


def write_fixtures(home: Path, registration_id: str, files: list[tuple[str, bytes]]) -> Path:
    """Writes each (relative POSIX path, bytes) under the registration's fixtures folder; the paths
    were checked (relative, no `..`, `\\` or NUL) before. Rewriting the same files is harmless."""
    folder = fixtures_folder(home, registration_id)
    for path, content in files:
        target = folder.joinpath(*PurePosixPath(path).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(target, content, 0o644)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_token(settings: Settings, registration_id: str, token: str) -> None:
    if sealed.can_seal(settings):
        stored = sealed.seal(settings, token.encode(), _associated(registration_id))
    else:
        stored = {"plain": token}
    target = registration_folder(settings.home, registration_id) / TOKEN_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(target, json.dumps(stored).encode(), 0o600)


def read_token(settings: Settings, registration_id: str) -> str | None:
    """The registration's token; None when it has none (or its file is gone or unreadable with the
    configured keys: the plugin is then called without one and refuses, which says what is wrong)."""
    try:
        stored = json.loads((registration_folder(settings.home, registration_id) / TOKEN_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if "plain" in stored:
        return stored["plain"]
    try:
        return sealed.unseal(settings, stored, _associated(registration_id)).decode()
    except sealed.Unreadable:  # a wrong key or a damaged file: no usable token
        return None


def _associated(registration_id: str) -> bytes:
    return f"plugin_token:{registration_id}".encode()


def _write_atomically(target: Path, content: bytes, mode: int) -> None:
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(content)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(temporary, mode)
    os.replace(temporary, target)
