"""The `cbbench serve` process: check the address, load the engine, serve with uvicorn under the server's limits, and
stop gracefully (shutdown.py).

The port is checked and bound BEFORE the model loads, so a bad or busy port fails in a moment with one line (the
caller's ValueError -> exit 2), and the bound socket is handed to uvicorn, so nothing can take the port in between.
The default host is 127.0.0.1: the server is reachable from this machine only unless `--host 0.0.0.0` is given.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from refengine.engine.llm_engine import LLMEngine
from refengine.entrypoints.address import bind_socket, check_shutdown_timeout
from refengine.entrypoints.api_server import build_app
from refengine.entrypoints.server_limits import KEEP_ALIVE_S, MAX_CONNECTIONS, MAX_HEAD_BYTES, GuardedH11Protocol
from refengine.entrypoints.shutdown import DrainingServer

log = logging.getLogger("refengine.server")
# On SIGTERM the requests in flight get this long to finish before they are aborted (`--shutdown-timeout`).
GRACEFUL_SHUTDOWN_S = 5.0
# uvicorn's own last wait (connections still open after the drain's aborts) before it cancels their tasks.
UVICORN_FINAL_WAIT_S = 5


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
    sock: socket.socket | None = None,
    time_scale: float | None = None,
) -> None:
    """Bind the port (or take `sock`, bound by bind_socket on host:port already), load the engine (bad knobs raise
    ValueError), then serve until stopped. `api_key` defaults to the VLLM_API_KEY environment variable, as in vLLM.
    The socket is closed when the server stops. `time_scale`: a simulated GPU's served clock (build_app)."""
    check_shutdown_timeout(shutdown_timeout)
    api_key = api_key or os.environ.get("VLLM_API_KEY") or None
    if sock is None:
        sock = bind_socket(host, port)
    try:
        # The server reads each step's stats once and drops them; keeping one is enough (see AsyncLLMEngine).
        engine = LLMEngine(**{"stats_log_size": 1, **engine_kwargs})
        app = build_app(engine, served_model_name, api_key=api_key, disable_docs=disable_docs, time_scale=time_scale)
        logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        log.info(
            "serving %s on http://%s:%d (num_gpu_blocks=%d, api key %s)",
            served_model_name or engine.config.model,
            host,
            port,
            engine.config.scheduler.num_gpu_blocks,
            "required" if api_key else "off",
        )
        if app.state.engine.pacer:  # a simulated GPU: say at what pace its clock is served
            pace = f"{time_scale:g} simulated s per wall s" if time_scale else "an adaptive time scale"
            log.info("simulated clock served at %s (x-sim-time-scale, cbbench:sim_time_scale)", pace)
        try:
            make_server(app, sock, log_level, shutdown_timeout).run(sockets=[sock])
        finally:  # the lifespan has normally shut it down already (idempotent); never while its thread may step it
            if not app.state.engine.is_running():
                engine.shutdown()
    finally:
        sock.close()
