"""What bounds a presigned PUT on this machine, measured beside it in `bench upload`.

A plain copy moves the bytes once, inside the kernel. A PUT moves them from the
client's file through a loopback socket into the API, hashes them and writes them.
Five references say how much of the gap is the API's:

  - the client alone: the same httpx PUT of the same file to a server that only
    reads the body and throws it away (a separate process, so that it does not
    share the client's interpreter);
  - the blob store alone: the same bytes read from the page cache in 256 KiB pieces
    (as uvicorn hands them to the route) and given to the store's own
    PipelinedWriter and FilesystemWriter, as the PUT route does, until they are
    fsync'd, with no HTTP, in a process of its own with the API's allocator settings;
  - the hash alone: SHA-256 of the same bytes from the page cache in one thread. A
    digest is sequential, so no store that names a Blob by its SHA-256 while it
    receives it takes bytes faster than one core hashes them;
  - a bare receiver: the same client's PUT to a server with no framework that does
    the PUT's work and nothing else, in one thread: it receives the body into one
    reused buffer (recv_into), hashes it, writes it to a file on the blob store's
    disk, fsyncs the file and answers with the digest. It says what that work costs
    on this machine without the service around it;
  - a spliced receiver: the fastest arrangement of that work found on these machines,
    which an ASGI application cannot use (it needs the raw socket): the bytes go from the
    socket through a pipe into the file with `os.splice` and never into the process for
    the write, writeback is started every 8 MiB as the blob store does, and a second
    thread hashes the file from a memory mapping as it grows. Where even it stays under the
    target, no arrangement of the PUT's work known here meets it on this machine.

The API can be no faster than the first or the third, nor, on two cores shared with
the client, than the second.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import mmap
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

from contentsvc.storage.blobstore import WRITEBACK_EVERY, FilesystemBlobStore, PipelinedWriter, start_writeback
from contentsvc.storage.heap import reuse_freed_buffers

CHUNK = 1024 * 1024
# The event loop reads a socket 256 KiB at a time, and uvicorn hands the route what one read
# brought: a 64 MiB PUT reached the route as 260 pieces of 240-256 KiB and a few smaller.
RECEIVED_PIECE = 256 * 1024


def _request_head(conn: socket.socket) -> tuple[int, bytes]:
    """The Content-Length of the request arriving on `conn`, and the body bytes read with its head."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = conn.recv(65536)
        if not data:
            break
        head += data
    header, _, body = head.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return length, body


def _answer_digest(conn: socket.socket, digest: str) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (len(digest), digest.encode()))


def _serve(listener: socket.socket, store: Path | None) -> None:
    """Answers each request after reading its Content-Length bytes, forever: 204 when `store` is
    None (the bytes are thrown away), else 200 with the body's SHA-256 once the bytes were hashed,
    written to a file in `store` and fsync'd (the file is removed afterwards)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        conn, _ = listener.accept()
        with conn:
            length, body = _request_head(conn)
            digest, fd = hashlib.sha256(), None
            if store is not None:
                fd = os.open(store / "received.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                digest.update(body)
                os.write(fd, body)
            left = length - len(body)
            while left > 0:
                received = conn.recv_into(buffer, min(CHUNK, left))
                if not received:
                    break
                left -= received
                if fd is not None:
                    digest.update(view[:received])
                    os.write(fd, view[:received])
            if fd is None:
                conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
                continue
            os.fsync(fd)
            os.close(fd)
            (store / "received.bin").unlink()
            _answer_digest(conn, digest.hexdigest())


class _GrowingFileHasher:
    """Hashes a file from a memory mapping while another thread writes it: told how far the file
    is written, it hashes up to there in pieces of at least HASH_STEP, in its own thread."""

    HASH_STEP = 4 * CHUNK

    def __init__(self, fd: int, length: int) -> None:
        self._map = mmap.mmap(fd, length, prot=mmap.PROT_READ)
        self._digest = hashlib.sha256()
        self._written, self._ended = 0, False
        self._moved = threading.Condition()
        self._thread = threading.Thread(target=self._hash_as_written)
        self._thread.start()

    def written(self, upto: int) -> None:
        with self._moved:
            self._written = upto
            self._moved.notify()

    def hexdigest(self) -> str:
        """The file's SHA-256, once every byte told of was hashed."""
        with self._moved:
            self._ended = True
            self._moved.notify()
        self._thread.join()
        self._map.close()
        return self._digest.hexdigest()

    def _hash_as_written(self) -> None:
        done, view = 0, memoryview(self._map)
        try:
            while True:
                with self._moved:
                    while self._written - done < self.HASH_STEP and not self._ended:
                        self._moved.wait()
                    upto, ended = self._written, self._ended
                self._digest.update(view[done:upto])
                done = upto
                if ended:
                    return
        finally:
            view.release()


def _serve_spliced(listener: socket.socket, store: Path) -> None:
    """Answers each request with its body's SHA-256 once the bytes were spliced from the socket
    into a file in `store` (through a pipe, never into the process), hashed from a memory mapping
    of that file by a second thread as it grew, and fsync'd; the file is removed afterwards."""
    target = store / "received.bin"
    pipe_out, pipe_in = os.pipe()
    fcntl.fcntl(pipe_in, fcntl.F_SETPIPE_SZ, CHUNK)
    while True:
        conn, _ = listener.accept()
        with conn:
            length, body = _request_head(conn)
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, length)  # the mapping covers the whole body from the start
            hasher = _GrowingFileHasher(fd, length)
            written = os.pwrite(fd, body, 0)
            written_back = 0
            while written < length:
                received = os.splice(conn.fileno(), pipe_in, min(CHUNK, length - written))
                if not received:
                    break
                moved = 0
                while moved < received:
                    moved += os.splice(pipe_out, fd, received - moved, offset_dst=written + moved)
                written += received
                hasher.written(written)
                if written - written_back >= WRITEBACK_EVERY:
                    start_writeback(fd, written_back, written - written_back)
                    written_back = written
            digest = hasher.hexdigest()
            os.fsync(fd)
            os.close(fd)
            target.unlink()
            _answer_digest(conn, digest)


def _put_seconds(chunks: Iterator[bytes], headers: dict[str, str], receiver: str, store: Path | None = None) -> float:
    """Seconds for httpx to PUT `chunks` to a `receiver` ("discard", "bare" or "spliced") on
    loopback, in its own process (so that it does not share the client's interpreter); given a
    `store` to write into, the answer must be the SHA-256 the client sent as x-content-sha256."""
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "contentsvc.bench.upload_references", receiver] + ([str(store)] if store else [])
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        with httpx.Client(timeout=httpx.Timeout(300.0)) as client:
            started = time.perf_counter()
            r = client.put(f"http://127.0.0.1:{port}/", content=chunks, headers=headers)
            elapsed = time.perf_counter() - started
        r.raise_for_status()
        if store is not None and r.text != headers["x-content-sha256"]:
            raise RuntimeError(f"the receiver hashed {r.text}, not {headers['x-content-sha256']}")
        return elapsed
    finally:
        server.kill()
        server.wait()


def client_alone_seconds(chunks: Iterator[bytes], headers: dict[str, str]) -> float:
    """Seconds for httpx to PUT `chunks` to a server on loopback that discards them."""
    return _put_seconds(chunks, headers, "discard")


def bare_receiver_seconds(chunks: Iterator[bytes], headers: dict[str, str], store: Path) -> float:
    """Seconds for httpx to PUT `chunks` to a bare receiver that hashes, writes and fsyncs them in
    `store`; `headers` carry the bytes' SHA-256 as x-content-sha256, checked against its answer."""
    return _put_seconds(chunks, headers, "bare", store)


def spliced_receiver_seconds(chunks: Iterator[bytes], headers: dict[str, str], store: Path) -> float:
    """Seconds for httpx to PUT `chunks` to a spliced receiver that writes them into `store` with
    os.splice, hashes them from a memory mapping in a second thread and fsyncs them; `headers`
    carry the bytes' SHA-256 as x-content-sha256, checked against its answer."""
    return _put_seconds(chunks, headers, "spliced", store)


def durably_timed(target: Path, write: Callable[[], None]) -> float:
    """Seconds for write() to make `target` and for its bytes to reach the disk (fsync); the
    file is removed afterwards: how the copy's ceiling is timed."""
    started = time.perf_counter()
    write()
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - started
    target.unlink()
    return elapsed


def hash_alone_seconds(source: Path) -> float:
    """Seconds to read `source` (from the page cache) and hash it with SHA-256 in one thread."""
    digest = hashlib.sha256()
    started = time.perf_counter()
    with open(source, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return time.perf_counter() - started


def store_alone_seconds(source: Path, store_root: Path) -> float:
    """Seconds for the blob store's own code to hash, write and fsync `source` (read from the page
    cache: it was just written) fed as the PUT route feeds it, without HTTP, in a process of its
    own with the API's allocator settings (storage/heap.py reuse_freed_buffers). The file is dropped."""
    argv = [sys.executable, "-m", "contentsvc.bench.upload_references", "store-alone", str(source), str(store_root)]
    return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def _store_alone(source: Path, store_root: Path) -> float:
    reuse_freed_buffers()  # as the API does at start
    store = FilesystemBlobStore(store_root)

    async def feed() -> None:
        pipe = PipelinedWriter(store.writer())
        try:
            with open(source, "rb", buffering=0) as f:
                while piece := f.read(RECEIVED_PIECE):
                    await pipe.write(piece)
            await pipe.close()  # ends with the fsync
        finally:
            await pipe.abort()

    started = time.perf_counter()
    asyncio.run(feed())
    return time.perf_counter() - started


if __name__ == "__main__":
    # `store-alone SOURCE ROOT` prints its seconds; `discard`, `bare STORE` and `spliced STORE`
    # print the port they answer on, then serve until killed.
    mode, paths = sys.argv[1], [Path(arg) for arg in sys.argv[2:]]
    if mode == "store-alone":
        print(_store_alone(*paths))
        sys.exit(0)
    with socket.create_server(("127.0.0.1", 0)) as listening:
        print(listening.getsockname()[1], flush=True)
        if mode == "spliced":
            _serve_spliced(listening, paths[0])
        else:
            _serve(listening, paths[0] if mode == "bare" else None)
