"""Who may call the server, and when: the API key (vLLM's `--api-key` / VLLM_API_KEY) and the drain on shutdown.

`Gate` is the outermost ASGI layer. With a key set, every route but /health and /metrics (open in vLLM too, for
probes and scrapers) needs `Authorization: Bearer <key>`, else 401. While the server drains (after SIGTERM) every
new request is a 503 at once, /health included, so a load balancer stops routing here. It also counts the requests
in flight, which is what the drain waits on.
"""

from __future__ import annotations

import asyncio
import hmac

from refengine.entrypoints.server_limits import ASGIApp, Receive, Scope, Send, send_error

OPEN_PATHS = ("/health", "/metrics")  # open without the API key, as vLLM leaves them


class Drain:
    """The server's stop state, shared by the Gate (which counts requests) and the server (which drains them)."""

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if self.in_flight == 0:
                self._idle.set()
        return self._idle

    def enter(self) -> None:
        self.in_flight += 1
        self._event().clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._event().set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once no request is in flight, False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._event().wait(), timeout_s)
            return True
        except TimeoutError:
            return False


class Gate:
    def __init__(self, app: ASGIApp, drain: Drain, api_key: str | None = None) -> None:
        self.app, self.drain, self.api_key = app, drain, api_key

    def _authorised(self, scope: Scope) -> bool:
        if self.api_key is None or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return True
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        # constant-time compare: the key is not guessable byte by byte from response times
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.drain.draining:
            return await send_error(send, 503, "the server is shutting down")
        if not self._authorised(scope):
            return await send_error(send, 401, "missing or wrong API key (send Authorization: Bearer <key>)")
        self.drain.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.leave()
