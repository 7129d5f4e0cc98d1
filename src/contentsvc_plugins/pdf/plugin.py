"""The first-party `pdf` normalizer (decisions-part2): one Part per page with text, key
`page-N`, role `body`, after a `title` Part from the document's /Title when set.

The input Blob comes by reference (`input.reference.url`, a `file://` URL in the blob
store); its size and sha256 are checked against the request before parsing, so the
text always belongs to the verified Blob. Every refusal is the plugin error body:
`encrypted_pdf` and `no_text` as the contract names them, `invalid_pdf` for bytes
pypdf cannot read, `pdf_limit_exceeded` for a PDF needing more memory or CPU than the
configuration allows, all terminal (the same bytes give the same answer). Each PDF is read in
a child process under those limits (`bounded`).
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path
from urllib.parse import unquote, urlparse

from contentsvc.plugins.manifest import Manifest
from contentsvc_plugins.pdf.bounded import READERS, Bounds, read_bounded
from contentsvc_plugins.server import Plugin, PluginError, terminal

FOLDER = Path(__file__).resolve().parent


def build() -> Plugin:
    plugin = Plugin(folder=FOLDER, handlers={})

    async def normalizer(request: dict) -> dict:
        return await normalize(request, plugin.pinned.manifest)

    plugin.handlers["normalizer"] = normalizer
    READERS.warm()  # before serving: the first PDF does not wait for the forkserver to start
    return plugin


async def normalize(request: dict, manifest: Manifest) -> dict:
    blob = request.get("input")
    input_path(blob)  # a malformed request is refused here, without starting a reader
    bounds = Bounds.of(request.get("configuration"), wall_seconds=manifest.retry.timeout_seconds)
    parts, warnings = await read_bounded(blob, manifest.contributions.normalizer.max_parts, bounds)
    return {"manifest": {"kind": "manifest", "parts": parts}, "warnings": warnings}


def input_path(blob: object) -> Path:
    if not isinstance(blob, dict) or not isinstance(blob.get("reference"), dict):
        raise terminal("invalid_request", "input.reference is required", 400)
    url = blob["reference"].get("url")
    parsed = urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
        raise terminal("invalid_request", "input.reference.url must be a file:// URL", 400)
    return Path(unquote(parsed.path))


def read_input(blob: object) -> bytes:
    path = input_path(blob)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        # The engine verified this Blob before calling: a missing file is the store not being visible yet.
        raise PluginError(503, "blob_unreadable", "the input file is not readable here", retryable=True) from None
    except OSError as exc:
        raise PluginError(503, "blob_unreadable", f"the input file is not readable: {exc.strerror}",
                          retryable=True) from None
    if isinstance(blob.get("size_bytes"), int) and blob["size_bytes"] != len(data):
        raise terminal("blob_mismatch", f"the file has {len(data)} bytes, the request says {blob['size_bytes']}")
    if isinstance(blob.get("sha256"), str) and blob["sha256"].lower() != hashlib.sha256(data).hexdigest():
        raise terminal("blob_mismatch", "the file's sha256 differs from the request's")
    return data


def pdf_parts(data: bytes, max_parts: int) -> tuple[list[dict], list[dict]]:
    import pypdf
    from pypdf.errors import PyPdfError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # its warnings quote document content
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            raise terminal("encrypted_pdf", "the PDF is encrypted")
        title = _title(reader)
        pages = [(number, _page_text(page)) for number, page in enumerate(reader.pages, start=1)]
    except (PluginError, MemoryError):
        raise  # MemoryError: the reader's memory limit, which the bounded reader answers as such
    except PyPdfError as exc:
        raise terminal("invalid_pdf", f"the PDF cannot be read ({type(exc).__name__})") from None
    except Exception as exc:  # noqa: BLE001 - a parser failing on these bytes fails on them every time
        raise terminal("invalid_pdf", f"the PDF cannot be read ({type(exc).__name__})") from None

    parts = [{"key": "title", "role": "title", "content": {"kind": "text", "text": title}}] if title else []
    page_parts = [{"key": f"page-{number}", "role": "body", "content": {"kind": "text", "text": text}}
                  for number, text in pages if text]
    if not page_parts:
        raise terminal("no_text", "no page of the PDF has text")
    warnings = []
    room = max_parts - len(parts)
    if len(page_parts) > room:
        # The manifest's max_parts bounds the answer: later pages are dropped, and said so.
        warnings.append({"code": "pages_truncated",
                         "message": f"{len(page_parts) - room} page(s) with text beyond max_parts {max_parts} left out"})
        page_parts = page_parts[:room]
    return parts + page_parts, warnings


def _title(reader) -> str | None:
    metadata = reader.metadata
    title = metadata.title if metadata is not None else None
    return str(title).strip() or None if title else None


def _page_text(page) -> str:
    return (page.extract_text() or "").replace("\x00", "").strip()
