"""What bounds a presigned PUT on this machine, measured beside it in `bench upload`.

A plain copy moves the bytes once, inside the kernel. A PUT moves them from the
client's file through a loopback socket into the API, hashes them and writes them.
Three references say how much of the gap is the API's:

  - the client alone: the same httpx PUT of the same file to a server that only
    reads the body and throws it away (a separate process, so that it does not
    share the client's interpreter);
  - the blob store alone: the same bytes read from the page cache, hashed with
    SHA-256 in one thread while another writes them with os.write in 1 MiB chunks,
    then fsync'd, as the blob store does, in the bench's process, with no HTTP;
  - the hash alone: SHA-256 of the same bytes from the page cache in one thread. A
    digest is sequential, so no store that names a Blob by its SHA-256 while it
    receives it takes bytes faster than one core hashes them.

The API can be no faster than the first or the third, and on two cores shared with
the client it hashes and writes what the second measures.
"""

from __future__ import annotations

import hashlib
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

CHUNK = 1024 * 1024


def _serve_discarding(listener: socket.socket) -> None:
    """Answers each request with 204 after reading its Content-Length bytes, forever."""
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
            left, buffer = length - len(body), bytearray(CHUNK)
            while left > 0:
                received = conn.recv_into(buffer, min(CHUNK, left))
                if not received:
                    break
                left -= received
            conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")


def client_alone_seconds(chunks: Iterator[bytes], headers: dict[str, str]) -> float:
    """Seconds for httpx to PUT `chunks` to a discarding server on loopback."""
    sink = subprocess.Popen([sys.executable, "-m", "contentsvc.bench.upload_references"], stdout=subprocess.PIPE,
                            text=True)
    try:
        port = int(sink.stdout.readline())
        with httpx.Client(timeout=httpx.Timeout(300.0)) as client:
            started = time.perf_counter()
            r = client.put(f"http://127.0.0.1:{port}/", content=chunks, headers=headers)
            elapsed = time.perf_counter() - started
        r.raise_for_status()
        return elapsed
    finally:
        sink.kill()
        sink.wait()


def durably_timed(target: Path, write: Callable[[], None]) -> float:
    """Seconds for write() to make `target` and for its bytes to reach the disk (fsync); the
    file is removed afterwards. The copy's ceiling and the store's reference are both timed so."""
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


def store_alone_seconds(source: Path, target: Path) -> float:
    """Seconds to read `source` (from the page cache: it was just written) and hash and write it
    into `target` as the blob store does (hashing in a second thread), until it is on the disk."""
    def hash_and_write() -> None:
        digest, chunks = hashlib.sha256(), queue.Queue(maxsize=4)

        def hash_chunks() -> None:
            while (chunk := chunks.get()) is not None:
                digest.update(chunk)

        hasher = threading.Thread(target=hash_chunks)
        hasher.start()
        try:
            with open(source, "rb") as f, open(target, "wb", buffering=0) as out:
                while chunk := f.read(CHUNK):
                    chunks.put(chunk)
                    view = memoryview(chunk)
                    while view:
                        view = view[out.write(view):]
        finally:
            chunks.put(None)
            hasher.join()

    return durably_timed(target, hash_and_write)


if __name__ == "__main__":
    with socket.create_server(("127.0.0.1", 0)) as listening:
        print(listening.getsockname()[1], flush=True)
        _serve_discarding(listening)
