"""The filesystem blob store (issue 5: atomic writes, content never overwritten,
hashing while streaming), the pipelined async writer, and the pure parts of
uploads (URL signatures, required headers) and of the text path for Blobs."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contentsvc.storage.blobstore import FilesystemBlobStore, PipelinedWriter, check_key, key_for
from contentsvc.domain import uploads as up
from contentsvc.domain.normalize import TextPathError, blob_text, html_to_text, text_route_refusal
from contentsvc.domain.errors import ApiError


def write_all(store: FilesystemBlobStore, chunks: list[bytes]):
    w = store.writer()
    for chunk in chunks:
        w.write(chunk)
    return w


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=4096), cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12))
def test_any_split_of_the_same_bytes_yields_the_same_digest_and_key(data, cuts):
    # Issue 5: the writer hashes on the way; chunking never changes the digest, the size or the key.
    with tempfile.TemporaryDirectory() as root:
        store = FilesystemBlobStore(Path(root))
        w = write_all(store, splits(data, cuts))
        assert w.size == len(data)
        assert w.hexdigest() == hashlib.sha256(data).hexdigest()
        key = w.commit()
        assert key == key_for(hashlib.sha256(data).hexdigest())
        with store.open_read(key) as f:
            assert f.read() == data


def test_commit_is_atomic_and_leaves_no_temporary_file(tmp_path):
    store = FilesystemBlobStore(tmp_path)
    w = write_all(store, [b"hello ", b"world"])
    temp = w.temp_path
    assert temp.parent == tmp_path / "incoming" and temp.exists()
    key = w.commit()
    final = store.path_for(key)
    # layout blobs/sha256/ab/cd/<hex>; the partial upload is gone.
    assert final.relative_to(tmp_path).parts[:3] == ("sha256", key.split("/")[1], key.split("/")[2])
    assert final.read_bytes() == b"hello world"
    assert not temp.exists() and list((tmp_path / "incoming").iterdir()) == []
    assert store.exists(key)
    assert not os.access(final, os.W_OK) or os.geteuid() == 0  # committed content is read-only
    assert final.stat().st_mode & 0o222 == 0


def test_content_is_never_overwritten(tmp_path):
    store = FilesystemBlobStore(tmp_path)
    first = write_all(store, [b"same bytes"]).commit()
    inode = store.path_for(first).stat().st_ino
    second = write_all(store, [b"same ", b"bytes"]).commit()
    assert second == first
    assert store.path_for(first).stat().st_ino == inode  # the first file was kept
    # Even a file that no longer holds what its key says is not replaced by a commit.
    path = store.path_for(first)
    os.chmod(path, 0o644)
    path.write_bytes(b"damaged")
    assert write_all(store, [b"same bytes"]).commit() == first
    assert path.read_bytes() == b"damaged"
    assert list((tmp_path / "incoming").iterdir()) == []


def test_abort_drops_the_partial_upload(tmp_path):
    store = FilesystemBlobStore(tmp_path)
    w = write_all(store, [b"partial"])
    w.abort()
    w.abort()  # idempotent
    assert list((tmp_path / "incoming").iterdir()) == []
    assert not store.exists(key_for(hashlib.sha256(b"partial").hexdigest()))
    committed = write_all(store, [b"kept"])
    key = committed.commit()
    committed.abort()  # a no-op after commit
    assert store.exists(key)


def test_sweep_removes_only_idle_partial_uploads(tmp_path):
    store = FilesystemBlobStore(tmp_path)
    idle, active = write_all(store, [b"left by a crash"]), write_all(store, [b"still arriving"])
    old = idle.temp_path.stat().st_mtime - 2 * 86400
    os.utime(idle.temp_path, (old, old))
    assert store.sweep_incoming() == 1
    assert not idle.temp_path.exists() and active.temp_path.exists()
    active.abort()


def test_keys_are_checked(tmp_path):
    store = FilesystemBlobStore(tmp_path)
    for bad in ["../etc/passwd", "sha256/aa/bb/" + "a" * 64, "sha256/aa/aa/" + "A" * 64, "sha256/" + "a" * 64]:
        with pytest.raises(ValueError):
            store.path_for(bad)
    check_key(key_for("ab" * 32))


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(min_value=0, max_value=3000), max_size=20))
def test_pipelined_writer_keeps_order_and_digest(sizes):
    data = os.urandom(sum(sizes))

    async def run(root: Path):
        store = FilesystemBlobStore(root)
        w = store.writer()
        pipe = PipelinedWriter(w, chunk_size=1024)
        offset = 0
        for n in sizes:
            await pipe.write(data[offset:offset + n])
            offset += n
        await pipe.close()  # several 1 KiB batches were queued for the hashing and writing threads at once
        written = w.size, w.hexdigest()
        key = w.commit()
        await pipe.abort()
        return written, store.open_read(key).read()

    with tempfile.TemporaryDirectory() as root:
        (size, digest), stored = asyncio.run(run(Path(root)))
        # the hashing thread and the writing thread each took every batch, in order
        assert size == len(data) and digest == hashlib.sha256(data).hexdigest() and stored == data


def test_a_failed_write_leaves_no_file_and_no_write_running(tmp_path):
    # The disk fails on the third batch while more are queued: the upload fails, and abort waits
    # for every queued write before it closes and drops the file.
    store = FilesystemBlobStore(tmp_path)
    w = store.writer()
    real_store, calls = w.store, []

    def failing_store(chunk: bytes) -> None:
        calls.append(len(chunk))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_store(chunk)

    w.store = failing_store

    async def run():
        pipe = PipelinedWriter(w, chunk_size=1024)
        with pytest.raises(OSError):
            for _ in range(20):
                await pipe.write(os.urandom(1024))
            await pipe.close()
        await pipe.abort()

    asyncio.run(run())
    assert not w.temp_path.exists() and list((tmp_path / "incoming").glob("*.part")) == []


# ----------------------------------------------------------------- upload URLs and headers


def test_signature_binds_upload_and_expiry():
    secret = b"k" * 32
    sig = up.sign(secret, "upl_1", 1000)
    assert up.signature_valid(secret, "upl_1", 1000, sig)
    assert not up.signature_valid(secret, "upl_2", 1000, sig)
    assert not up.signature_valid(secret, "upl_1", 1001, sig)
    assert not up.signature_valid(b"x" * 32, "upl_1", 1000, sig)
    assert not up.signature_valid(secret, "upl_1", 1000, sig[:-1])


def test_put_headers_are_checked():
    h = {"content-type": "text/plain; charset=UTF-8", "content-length": "3", "x-content-sha256": "a" * 64}
    up.check_put_headers(h, "text/plain;charset=UTF-8", 3, "a" * 64)
    with pytest.raises(ApiError) as exc:
        up.check_put_headers({k: v for k, v in h.items() if k != "content-length"}, "text/plain; charset=UTF-8", 3,
                             "a" * 64)
    assert exc.value.status == 400 and exc.value.code == "missing_header"
    with pytest.raises(ApiError) as exc:
        up.check_put_headers(h, "text/plain; charset=latin-1", 3, "a" * 64)
    assert exc.value.status == 422 and exc.value.code == "header_mismatch"


def test_verdict_names_size_before_checksum():
    assert up.verdict(3, "a", 3, "a") is None
    assert up.verdict(3, "a", 2, "b")["code"] == "size_mismatch"
    assert up.verdict(3, "a", 3, "b")["code"] == "checksum_mismatch"


# ----------------------------------------------------------------- the text path for Blobs


def test_text_route_refusal():
    assert text_route_refusal("text/plain") is None
    assert text_route_refusal("TEXT/Markdown; charset=utf-8") is None
    assert "text/*" in text_route_refusal("application/pdf")
    assert "nope" in text_route_refusal("text/plain; charset=nope")


def test_blob_text_charsets_and_html():
    assert blob_text("naïve".encode("latin-1"), 'text/plain; charset="iso-8859-1"') == "naïve"
    assert blob_text(b"\xef\xbb\xbfBOM", "text/plain") == "BOM"  # a UTF-8 byte order mark is dropped
    assert blob_text("e\u0301".encode(), "text/markdown") == "\u00e9"
    assert html_to_text("<p>a<br>b</p><script>x()</script><style>p{}</style><p>c&nbsp;d</p>") == "a\nb\nc d"
    with pytest.raises(TextPathError) as exc:
        blob_text(b"\xff", "text/plain")
    assert exc.value.code == "normalizer_failed" and "utf-8" in exc.value.message
    with pytest.raises(TextPathError):
        blob_text(b"<script>only()</script>", "text/html")
