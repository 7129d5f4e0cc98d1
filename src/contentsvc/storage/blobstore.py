"""Blob stores: where uploaded bytes live, content addressed by SHA-256.

A writer streams chunks, hashing (SHA-256) and counting them on the way, so
no caller ever holds a whole Blob in memory. `commit` places the bytes
under their content's key atomically and never overwrites what a key
already holds: equal keys mean equal bytes, so a second commit of the same
content keeps the first file and drops its own.

`FilesystemBlobStore` keeps everything under one root
(CONTENTSVC_HOME/blobs by default):

    incoming/<random>.part      partial uploads, one temporary file each
    sha256/ab/cd/<64 hex>       committed content (read-only files)

Keys are storage-neutral strings (`sha256/ab/cd/<hex>`): an S3-compatible
store can implement the same protocol with the key as its object name
(multipart upload for the writer, a conditional put for "only if absent").
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import hashlib
import os
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, Iterator, Protocol

from contentsvc.libc import libc_function

CHUNK = 1024 * 1024
_KEY = re.compile(r"^sha256/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})$")


def key_for(sha256_hex: str) -> str:
    """The content-addressed key of bytes whose SHA-256 is sha256_hex."""
    return f"sha256/{sha256_hex[:2]}/{sha256_hex[2:4]}/{sha256_hex}"


def check_key(key: str) -> re.Match:
    match = _KEY.match(key)
    if match is None or match.group(1) != match.group(3)[:2] or match.group(2) != match.group(3)[2:4]:
        raise ValueError(f"not a blob key: {key!r}")
    return match


class BlobWriter(Protocol):
    """One upload's bytes on their way into the store."""

    @property
    def size(self) -> int:
        """Bytes written so far."""

    def write(self, chunk: bytes) -> None:
        """Hash, count and store one chunk."""

    def hash(self, chunk: bytes) -> None:
        """The hashing half of write: the two halves may run in two threads at once, each
        given the chunks in order."""

    def store(self, chunk: bytes) -> None:
        """The counting and storing half of write."""

    def hexdigest(self) -> str:
        """SHA-256 (lowercase hex) of everything written so far."""

    def finish(self) -> None:
        """Make the written bytes durable (before commit; idempotent)."""

    def commit(self) -> str:
        """Place the bytes under their key (atomic, never overwriting); returns the key."""

    def abort(self) -> None:
        """Drop the bytes (idempotent; a no-op after commit)."""


class BlobStore(Protocol):
    def writer(self) -> BlobWriter: ...

    def open_read(self, key: str) -> BinaryIO:
        """A streaming reader of committed content (FileNotFoundError when absent)."""

    def exists(self, key: str) -> bool: ...

    def path_for(self, key: str) -> Path | None:
        """A local path for the key, where the store has one (None for remote stores)."""


WRITEBACK_EVERY = 8 * 1024 * 1024
_SYNC_FILE_RANGE_WRITE = 2


# Linux sync_file_range(2), or None: lets the disk start writing while bytes still arrive.
_sync_file_range = libc_function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])


def start_writeback(fd: int, start: int, length: int) -> None:
    """Start (not wait for) the disk's writing of `length` bytes of `fd` from `start`, where Linux
    offers it: a file's final fsync then finds little left to do, however large the file."""
    if _sync_file_range is not None:
        _sync_file_range(fd, start, length, _SYNC_FILE_RANGE_WRITE)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FilesystemWriter:
    def __init__(self, store: "FilesystemBlobStore") -> None:
        self._store = store
        self._hash = hashlib.sha256()
        self._size = 0
        self.temp_path = store.incoming / f"{secrets.token_hex(16)}.part"
        self._fd: int | None = os.open(self.temp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self._durable = False
        self._done = False
        self._written_back = 0  # bytes whose writeback was started

    @property
    def size(self) -> int:
        return self._size

    def write(self, chunk: bytes) -> None:
        self.hash(chunk)
        self.store(chunk)

    def hash(self, chunk: bytes) -> None:
        self._hash.update(chunk)

    def store(self, chunk: bytes) -> None:
        if self._fd is None:
            raise ValueError("writer is closed")
        view = memoryview(chunk)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        self._size += len(chunk)
        if self._size - self._written_back >= WRITEBACK_EVERY:
            start_writeback(self._fd, self._written_back, self._size - self._written_back)
            self._written_back = self._size

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def finish(self) -> None:
        if self._fd is not None and not self._durable:
            os.fsync(self._fd)
            self._durable = True

    def commit(self) -> str:
        if self._done:
            raise ValueError("writer already committed or aborted")
        self.finish()
        os.close(self._fd)
        self._fd = None
        key = key_for(self.hexdigest())
        final = self._store.root / key
        final.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(self.temp_path, 0o444)
        try:
            # link() fails when the name exists: content already there is never replaced.
            os.link(self.temp_path, final)
            _fsync_dir(final.parent)
        except FileExistsError:
            pass
        finally:
            self.temp_path.unlink(missing_ok=True)
            self._done = True
        return key

    def abort(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if not self._done:
            self.temp_path.unlink(missing_ok=True)
            self._done = True


class FilesystemBlobStore:
    """Blobs as files under root (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.incoming = self.root / "incoming"
        self.incoming.mkdir(parents=True, exist_ok=True)
        (self.root / "sha256").mkdir(parents=True, exist_ok=True)

    def writer(self) -> FilesystemWriter:
        return FilesystemWriter(self)

    def path_for(self, key: str) -> Path:
        check_key(key)
        return self.root / key

    def open_read(self, key: str) -> BinaryIO:
        return open(self.path_for(key), "rb")

    def exists(self, key: str) -> bool:
        return self.path_for(key).is_file()

    def sweep_incoming(self, idle_seconds: float = 86400.0) -> int:
        """Removes partial uploads nobody wrote to for idle_seconds (left by a crash); returns how many."""
        cutoff = time.time() - idle_seconds
        removed = 0
        for path in self.incoming.glob("*.part"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


def read_chunks(reader: BinaryIO, size: int = CHUNK) -> Iterator[bytes]:
    while chunk := reader.read(size):
        yield chunk


class PipelinedWriter:
    """Feeds a BlobWriter from async code, about 1 MiB at a time.

    Received chunks are collected (not copied) until about chunk_size
    bytes, then hashed in one of the upload's own threads and written in
    the other (hashlib and os.write release the GIL) while the event loop
    receives the next ones, so bytes are stored at the pace of the slower of
    the two rather than their sum (docs/decisions.md, uploads). Up to IN_FLIGHT
    batches wait for those threads, so neither side stalls the other on
    every batch: with one, each side was idle half the time (the event loop
    used 0.4 of a core, the thread 0.66), and a stalled event loop stops
    reading the socket, which stalls the sender.
    Memory stays at about IN_FLIGHT + 1 batches whatever the Blob's size,
    and a slow disk slows the sender down instead of filling memory.
    """

    IN_FLIGHT = 4

    def __init__(self, writer: BlobWriter, chunk_size: int = CHUNK) -> None:
        self.writer = writer
        self.chunk_size = chunk_size
        self._batch: list[bytes] = []
        self._batch_bytes = 0
        self._pending: collections.deque[asyncio.Future] = collections.deque()
        # Two threads per upload, each taking the batches in order: one hashes them while the
        # other writes them, so a Blob is stored at the slower one's pace, not at their sum's.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blob-writer")
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="blob-hasher")

    def _hash_batch(self, batch: list[bytes]) -> None:
        for chunk in batch:
            self.writer.hash(chunk)

    def _store_batch(self, batch: list[bytes]) -> None:
        for chunk in batch:
            self.writer.store(chunk)

    def _in_thread(self, fn, *args) -> asyncio.Future:
        return asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self._batch.append(data)
        self._batch_bytes += len(data)
        if self._batch_bytes >= self.chunk_size:
            await self._hand_off()

    async def _hand_off(self, keep: int = IN_FLIGHT - 1) -> None:
        """Queue the filling batch, then wait until at most `keep` batches are queued."""
        if self._batch:
            batch, self._batch, self._batch_bytes = self._batch, [], 0
            hashed = asyncio.get_running_loop().run_in_executor(self._hasher, self._hash_batch, batch)
            self._pending.append(asyncio.gather(hashed, self._in_thread(self._store_batch, batch)))
        while len(self._pending) > keep:
            await self._pending.popleft()

    async def close(self) -> None:
        """Write what is left and make it durable."""
        await self._hand_off(keep=0)
        await self._in_thread(self.writer.finish)

    async def abort(self) -> None:
        """Drop the bytes (a no-op after commit) and end the upload's thread."""
        while self._pending:  # every queued write ends before the file is closed
            try:
                await self._pending.popleft()
            except Exception:
                pass
        self._batch, self._batch_bytes = [], 0
        try:
            await self._in_thread(self.writer.abort)
        finally:
            self._thread.shutdown(wait=False)
            self._hasher.shutdown(wait=False)
