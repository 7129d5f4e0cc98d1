"""Uploads (pure): presigned PUT URLs, required headers, verification verdicts.

The PUT URL is served by the API itself and needs no API key: it carries
`expires` (Unix seconds) and `signature`, an HMAC-SHA256 over the method,
the path, the upload id and `expires`, keyed by the `upload_hmac` secret of
`service_secrets`. Changing any of them invalidates the signature.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import datetime, timezone
from typing import Any

from contentsvc.domain.errors import ApiError

PUT_METHOD = "PUT"
SHA256_HEADER = "x-content-sha256"


def content_path(upload_id: str) -> str:
    return f"/v0/uploads/{upload_id}/content"


def _message(upload_id: str, expires: int) -> bytes:
    return "\n".join((PUT_METHOD, content_path(upload_id), upload_id, str(expires))).encode()


def sign(secret: bytes, upload_id: str, expires: int) -> str:
    tag = hmac.new(secret, _message(upload_id, expires), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(tag).rstrip(b"=").decode()


def signature_valid(secret: bytes, upload_id: str, expires: int, signature: str) -> bool:
    return hmac.compare_digest(sign(secret, upload_id, expires).encode(), signature.encode())


def put_query(secret: bytes, upload_id: str, expires_at: datetime) -> str:
    expires = int(expires_at.timestamp())
    return f"expires={expires}&signature={sign(secret, upload_id, expires)}"


def put_url(base_url: str, secret: bytes, upload_id: str, expires_at: datetime) -> str:
    """An Upload's presigned PUT URL on the API at `base_url`."""
    return f"{base_url}{content_path(upload_id)}?{put_query(secret, upload_id, expires_at)}"


def put_headers(media_type: str, size_bytes: int, sha256: str) -> dict[str, str]:
    """Exactly the headers the presigned PUT requires."""
    return {"Content-Type": media_type, "Content-Length": str(size_bytes), SHA256_HEADER: sha256}


def normalize_media_type(value: str) -> str:
    """For comparing a Content-Type with the declared type: case of type and
    parameter names, and white space around ';' and '=', do not matter."""
    parts = [p.strip() for p in value.split(";")]
    out = [parts[0].lower()]
    for param in parts[1:]:
        name, _, val = param.partition("=")
        out.append(f"{name.strip().lower()}={val.strip()}")
    return ";".join(out)


def parse_media_type(value: str) -> tuple[str, dict[str, str]]:
    """('type/subtype' lowercased, {parameter: value}) with quotes removed."""
    parts = value.split(";")
    params: dict[str, str] = {}
    for param in parts[1:]:
        name, _, val = param.partition("=")
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] == '"':
            val = val[1:-1]
        params[name.strip().lower()] = val
    return parts[0].strip().lower(), params


def check_put_headers(headers: Any, media_type: str, size_bytes: int, sha256: str) -> None:
    """Refuses a PUT whose required headers are missing (400) or differ from the session (422)."""
    required = put_headers(media_type, size_bytes, sha256)
    for name in required:  # headers: a case-insensitive mapping, or a plain one with lowercase names
        if headers.get(name.lower()) is None:
            extra = " (chunked bodies are refused)" if name == "Content-Length" else ""
            raise ApiError(400, "missing_header", f"The header {name} is required on this PUT{extra}.")
    if normalize_media_type(headers.get("content-type")) != normalize_media_type(media_type):
        raise ApiError(422, "header_mismatch", f"Content-Type must be {media_type!r}, the Upload's media_type.")
    if headers.get("content-length").strip() != str(size_bytes):
        raise ApiError(422, "header_mismatch", f"Content-Length must be {size_bytes}, the Upload's size_bytes.")
    if headers.get(SHA256_HEADER).strip().lower() != sha256:
        raise ApiError(422, "header_mismatch", f"{SHA256_HEADER} must be {sha256}, the Upload's sha256.")


def verdict(declared_size: int, declared_sha256: str, size: int, sha256: str) -> dict[str, Any] | None:
    """None when the received bytes are the declared ones, else the Error of the failed session."""
    if size != declared_size:
        return {"code": "size_mismatch", "retryable": False,
                "message": f"Received {size} bytes; the Upload declared {declared_size}."}
    if sha256 != declared_sha256:
        return {"code": "checksum_mismatch", "retryable": False,
                "message": f"The received bytes have SHA-256 {sha256}; the Upload declared {declared_sha256}."}
    return None


EXPIRED_ERROR = {"code": "upload_expired", "retryable": False,
                 "message": "The upload URL expired before any bytes were received."}
# Received bytes never confirmed are collected at the session's expiry, as a verified Blob
# no ingest references is (projectors/gc.py).
UNCONFIRMED_ERROR = {"code": "upload_expired", "retryable": False,
                     "message": "The upload expired before it was confirmed; its bytes were deleted."}


def utc(ts: datetime) -> str:
    return ts.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
