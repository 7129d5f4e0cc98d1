"""One `run` or `serve` per CONTENTSVC_HOME: a lock file that names its holder.

The holder keeps an exclusive flock on home/contentsvc.pid for its lifetime and
writes its pid there. The kernel releases the lock when the holder dies however
it dies, so a lock file left by a crash is simply free again: the next start
takes it and writes its own pid.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "contentsvc.pid"


class HomeInUse(Exception):
    def __init__(self, home: Path, pid: int | None) -> None:
        self.home, self.pid = home, pid
        holder = f"pid {pid}" if pid else "another process"
        super().__init__(f"the home {home} is in use by {holder} (a running `contentsvc run` or `serve`): "
                         f"stop it, or set CONTENTSVC_HOME to another directory")


class HomeLock:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> HomeLock:
        self.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise HomeInUse(self.home, int(holder) if holder.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # Not inherited by children: the lock is this process's, and ends with it.
        os.set_inheritable(fd, False)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HomeLock:
        return self.acquire()

    def __exit__(self, *_) -> None:
        self.release()
