"""What bounds a presigned PUT on this machine, measured beside it in `bench upload`.

A plain copy moves the bytes once, inside the kernel. A PUT moves them from the
client's file through a loopback socket into the API, hashes them and writes them.
Four references say how much of the gap is the API's:

  - the client alone: the same httpx PUT of the same file to a server that only
    reads the body and throws it away (a separate process, so that it does not
    share the client's interpreter);
  - the blob store alone: the same bytes read from the page cache in 256 KiB pieces
    (as uvicorn hands them to the route) and given to the store's own
    PipelinedWriter and FilesystemWriter, as the PUT route does, until they are
    fsync'd, in the bench's process, with no HTTP;
  - the hash alone: SHA-256 of the same bytes from the page cache in one thread. A
    digest is sequential, so no store that names a Blob by its SHA-256 while it
    receives it takes bytes faster than one core hashes them;
  - a bare receiver: the same client's PUT to a server with no framework that does
    the PUT's work and nothing else, in one thread: it receives the body into one
    reused buffer (recv_into), hashes it, writes it to a file on the blob store's
    disk, fsyncs the file and answers with the digest. It says what that work costs
    on this machine without the service around it.

The API can be no faster than the first or the third, nor, on two cores shared with
the client, than the second.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

from contentsvc.storage.blobstore import FilesystemBlobStore, PipelinedWriter

CHUNK = 1024 * 1024
# The event loop reads a socket 256 KiB at a time, and uvicorn hands the route what one read
# brought: a 64 MiB PUT reached the route as 260 pieces of 240-256 KiB and a few smaller.
RECEIVED_PIECE = 256 * 1024


def _serve(listener: socket.socket, store: Path | None) -> None:
    """Answers each request after reading its Content-Length bytes, forever: 204 when `store` is
    None (the bytes are thrown away), else 200 with the body's SHA-256 once the bytes were hashed,
    written to a file in `store` and fsync'd (the file is removed afterwards)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    while True:
        conn, _ = listener.accept()
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(65536)
                if not data:
                    break
                head += data
            header, _, body = head.partition(b"\r\n\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
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
            answer = digest.hexdigest().encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(answer), answer))


def _put_seconds(chunks: Iterator[bytes], headers: dict[str, str], store: Path | None) -> float:
    """Seconds for httpx to PUT `chunks` to a `_serve` server on loopback, in its own process (so
    that it does not share the client's interpreter); with `store`, the answer must be the SHA-256
    the client sent as x-content-sha256."""
    argv = [sys.executable, "-m", "contentsvc.bench.upload_references"] + ([str(store)] if store else [])
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        with httpx.Client(timeout=httpx.Timeout(300.0)) as client:
            started = time.perf_counter()
            r = client.put(f"http://127.0.0.1:{port}/", content=chunks, headers=headers)
            elapsed = time.perf_counter() - started
        r.raise_for_status()
        if store is not None and r.text != headers["x-content-sha256"]:
            raise RuntimeError(f"the bare receiver hashed {r.text}, not {headers['x-content-sha256']}")
        return elapsed
    finally:
        server.kill()
        server.wait()


def client_alone_seconds(chunks: Iterator[bytes], headers: dict[str, str]) -> float:
    """Seconds for httpx to PUT `chunks` to a server on loopback that discards them."""
    return _put_seconds(chunks, headers, None)


def bare_receiver_seconds(chunks: Iterator[bytes], headers: dict[str, str], store: Path) -> float:
    """Seconds for httpx to PUT `chunks` to a bare receiver that hashes, writes and fsyncs them in
    `store`; `headers` carry the bytes' SHA-256 as x-content-sha256, checked against its answer."""
    store.mkdir(parents=True, exist_ok=True)
    return _put_seconds(chunks, headers, store)


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
    cache: it was just written) fed as the PUT route feeds it, without HTTP. The file is dropped."""
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
    with socket.create_server(("127.0.0.1", 0)) as listening:
        print(listening.getsockname()[1], flush=True)
        _serve(listening, Path(sys.argv[1]) if len(sys.argv) > 1 else None)
