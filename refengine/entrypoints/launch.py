"""The `cbbench serve` process: check the address, load the engine, serve with uvicorn under the server's limits, and
stop gracefully (shutdown.py).

The port is checked and bound BEFORE the model loads, so a bad or busy port fails in a moment with one line (the
caller's ValueError -> exit 2), and the bound socket is handed to uvicorn, so nothing can take the port in between.
The default host is 127.0.0.1: the server is reachable from this machine only unless `--host 0.0.0.0` is given.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from refengine.engine import LLMEngine
from refengine.entrypoints.api_server import build_app
from refengine.entrypoints.limits import KEEP_ALIVE_S, MAX_CONNECTIONS, MAX_HEAD_BYTES, GuardedH11Protocol
from refengine.entrypoints.shutdown import DrainingServer

log = logging.getLogger("refengine.server")
# On SIGTERM the requests in flight get this long to finish before they are aborted (`--shutdown-timeout`).
GRACEFUL_SHUTDOWN_S = 5.0
# uvicorn's own last wait (connections still open after the drain's aborts) before it cancels their tasks.
UVICORN_FINAL_WAIT_S = 5


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
    # connection got its first token about 35 ms late (measured on the simulated H200, whose steps are ~6 ms).
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


def make_server(
    app: FastAPI, sock: socket.socket, log_level: str = "info", grace_s: float = GRACEFUL_SHUTDOWN_S
) -> DrainingServer:
    """uvicorn over `app` with the server's limits (limits.py) and the graceful stop."""
    config = uvicorn.Config(
        app,
        fd=None,
        log_level=log_level,
        http=GuardedH11Protocol,
        ws="none",
        timeout_keep_alive=KEEP_ALIVE_S,
        limit_concurrency=MAX_CONNECTIONS,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_graceful_shutdown=UVICORN_FINAL_WAIT_S,
    )
    return DrainingServer(config, app.state.drain, app.state.serving, grace_s)


def run_server(
    engine_kwargs: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    log_level: str = "info",
    api_key: str | None = None,
    disable_docs: bool = False,
    shutdown_timeout: float = GRACEFUL_SHUTDOWN_S,
) -> None:
    """Bind the port, load the engine (bad knobs raise ValueError), then serve until stopped. `api_key` defaults
    to the VLLM_API_KEY environment variable, as in vLLM."""
    if shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout: must be >= 0 seconds, got {shutdown_timeout}")
    api_key = api_key or os.environ.get("VLLM_API_KEY") or None
    sock = bind_socket(host, port)
    try:
        # The server reads each step's stats once and drops them; keeping one is enough (see AsyncLLMEngine).
        engine = LLMEngine(**{"stats_log_size": 1, **engine_kwargs})
        app = build_app(engine, served_model_name, api_key=api_key, disable_docs=disable_docs)
        logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        log.info(
            "serving %s on http://%s:%d (num_gpu_blocks=%d, api key %s)",
            served_model_name or engine.config.model,
            host,
            port,
            engine.config.scheduler.num_gpu_blocks,
            "required" if api_key else "off",
        )
        try:
            make_server(app, sock, log_level, shutdown_timeout).run(sockets=[sock])
        finally:  # the lifespan has normally shut it down already (idempotent); never while its thread may step it
            if not app.state.engine.is_running():
                engine.shutdown()
    finally:
        sock.close()
