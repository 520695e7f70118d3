"""The server's address, checked and bound before anything heavy is imported: `cbbench serve --port 70000` (or a
busy port) fails in a moment with one line, without loading torch or the model. Standard library only.

The bound socket is handed to uvicorn (launch.py), so nothing can take the port in between.
"""

from __future__ import annotations

import errno
import socket


def check_shutdown_timeout(seconds: float) -> None:
    if seconds < 0:
        raise ValueError(f"shutdown_timeout: must be >= 0 seconds, got {seconds}")


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port; ValueError (one line, naming the field) if the port is out of range, the
    host unknown or the port taken."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port: must be in 1..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"host: cannot resolve {host!r} ({e.strerror})") from None
    family, _, _, _, addr = infos[0]
    # IPPROTO_TCP, not the default 0: asyncio turns Nagle off (TCP_NODELAY) only on connections of a socket that
    # names its protocol. With Nagle on, a token chunk written while the last one is unacknowledged waits for the
    # client's delayed ACK (40 ms on Linux): a request sent right after another finished on the same keep-alive
    # connection waited most of that delay for its first token, several steps of a fast GPU (docs/simulation.md).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses a TIME_WAIT port
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise ValueError(f"port: {port} on {host} is already in use") from None
        raise ValueError(f"host: cannot listen on {host}:{port} ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
