"""The API's listening socket, bound before anything else starts.

Binding first turns a busy port into one clear error and one exit status
(EXIT_BUSY) instead of a server that logs that it is ready and then fails,
and the supervisor reads that status as "do not restart".
"""

from __future__ import annotations

import socket

# EX_UNAVAILABLE (sysexits.h): the port or the home is held by another process.
EXIT_BUSY = 69


class PortInUse(Exception):
    def __init__(self, host: str, port: int, reason: str) -> None:
        self.host, self.port = host, port
        super().__init__(f"cannot listen on {host}:{port}: {reason} (another process holds the port: "
                         f"stop it, or choose another with --port or CONTENTSVC_PORT)")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, as uvicorn would bind it; PortInUse when it cannot be."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise PortInUse(host, port, f"unknown host ({exc.strerror})") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise PortInUse(host, port, exc.strerror or type(exc).__name__) from None
    return sock


def check_free(host: str, port: int) -> None:
    """Raises PortInUse when host:port cannot be bound now."""
    bind(host, port).close()
