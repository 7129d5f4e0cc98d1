"""The API's listening socket, bound before anything else starts.

Binding first turns a busy port into one clear error and one exit status
(EXIT_BUSY) instead of a server that logs that it is ready and then fails,
and the supervisor reads that status as "do not restart".
"""

from __future__ import annotations

import errno
import socket

# EX_UNAVAILABLE (sysexits.h): the port or the home is held by another process, or the address
# cannot be listened on.
EXIT_BUSY = 69


# Where an operator sets the address: the service's options and variables, or a plugin's options alone.
SERVICE = ("--host or CONTENTSVC_HOST", "--port or CONTENTSVC_PORT")
PLUGIN = ("--host", "--port")


class CannotListen(Exception):
    """host:port cannot be bound: `event` says why in one word, the message what to do."""

    def __init__(self, host: str, port: int, reason: str, code: int | None = None,
                 settings: tuple[str, str] = SERVICE) -> None:
        self.host, self.port = host, port
        host_setting, port_setting = settings
        if code == errno.EADDRINUSE:
            self.event = "port_in_use"
            hint = f"another process holds the port: stop it, or choose another port with {port_setting}"
        elif code == errno.EACCES:
            self.event = "port_not_permitted"
            hint = f"this user may not listen on that port: choose another port with {port_setting}"
        else:  # an unknown name, or an address that is not this machine's
            self.event = "host_not_local"
            hint = f"not an address of this machine: choose one with {host_setting} (127.0.0.1, 0.0.0.0, or one " \
                   "of its interfaces)"
        super().__init__(f"cannot listen on {host}:{port}: {reason} ({hint})")


def bind(host: str, port: int, settings: tuple[str, str] = SERVICE) -> socket.socket:
    """A listening socket on host:port, as uvicorn would bind it; CannotListen (naming `settings`,
    where host and port are chosen) when it cannot be."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise CannotListen(host, port, f"unknown host ({exc.strerror})", settings=settings) from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CannotListen(host, port, exc.strerror or type(exc).__name__, exc.errno, settings) from None
    return sock


def check_free(host: str, port: int) -> None:
    """Raises CannotListen when host:port cannot be bound now."""
    bind(host, port).close()
