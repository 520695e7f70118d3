"""The server's input bounds: what one client may send before it is refused, so that no request can stall the event
loop, the engine thread or other clients' connections. docs/serving-limits.md lists every value here.

Two layers own them: `BodyLimit` (ASGI) refuses an oversized body by its Content-Length, and again while reading
(a chunked or lying client), before any JSON is parsed, and bounds how long reading a body may take;
`GuardedH11Protocol` (uvicorn's h11 protocol) bounds how long a connection may take to send a request's head, which
uvicorn alone does not (its keep-alive timer starts only after a first response), so slowloris connections are closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from refengine.entrypoints.protocol import error_body

# A request body larger than this is a 413 before parsing. Sized for the largest legitimate body: a max-length
# token-id prompt of a 128k-context model as JSON (~7 bytes an id) fits with room for the other fields.
MAX_BODY_BYTES = 4 * 1024 * 1024
# A body must arrive within this long once its head is in (a client trickling its body holds a task and memory).
BODY_READ_TIMEOUT_S = 30.0
# A connection must send a complete request head within this long of opening (or of its last response):
# slowloris clients that trickle headers are closed after it.
HEADER_READ_TIMEOUT_S = 10.0
# h11's bound on a request head still being assembled (headers included): larger is a 400 from uvicorn.
MAX_HEAD_BYTES = 32 * 1024
# Idle keep-alive connections are closed after this long (uvicorn's timeout_keep_alive).
KEEP_ALIVE_S = 30
# Open connections plus running tasks beyond this get uvicorn's 503 (uvicorn's limit_concurrency): a bound on what
# a flood of connections can hold; far above any benchmark's concurrency.
MAX_CONNECTIONS = 4096
# Prompts in one /v1/completions call (each one is an engine request); above it the call is a 400.
MAX_PROMPTS_PER_CALL = 256

# ASGI's shapes (the ASGI spec's scope, messages and callables), as plain aliases
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _BodyTooLarge(Exception):
    pass


async def send_error(send: Send, status: int, message: str, param: str | None = None) -> None:
    """An OpenAI-shaped error response, straight over ASGI (for the layers in front of FastAPI)."""
    body = json.dumps(error_body(message, status, param)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuses a body over `max_bytes` (413) by Content-Length and while reading, and one that takes longer than
    `timeout_s` to arrive (408), before the app parses anything. It reads the body itself and hands it on whole
    (FastAPI would turn an error raised while it reads into its own 400)."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = BODY_READ_TIMEOUT_S):
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = f"the request body is larger than this server's limit of {self.max_bytes} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await send_error(
                send,
                413 if length.isdigit() else 400,
                too_large if length.isdigit() else "the Content-Length header is not a number",
            )
        try:
            body = await asyncio.wait_for(self._read_body(receive), self.timeout_s)
        except _BodyTooLarge:
            return await send_error(send, 413, too_large)
        except TimeoutError:
            return await send_error(send, 408, f"the request body did not arrive within {self.timeout_s:.0f} s")
        if body is None:  # the client left while sending
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, which streams watch for

        await self.app(scope, replay, send)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, read here so that the limit holds before anything parses it (None: the client left)."""
        parts: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                raise _BodyTooLarge
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for each request head: a connection that has not sent a complete
    head HEADER_READ_TIMEOUT_S after it opened (or after its last response) is closed."""

    head_timeout_s = HEADER_READ_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None  # armed per connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer(self.head_timeout_s)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # an idle keep-alive connection is uvicorn's to close; this bounds a head trickled after it
        self._arm_head_timer(self.timeout_keep_alive + self.head_timeout_s)

    def _arm_head_timer(self, delay_s: float) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        waiting_for = self.cycle  # the head has arrived once a new cycle replaces this one
        self._head_timer = self.loop.call_later(delay_s, self._head_timeout, waiting_for)

    def _head_timeout(self, waiting_for: object) -> None:
        self._head_timer = None
        if self.cycle is waiting_for and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)
