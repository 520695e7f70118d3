"""Graceful stop, as vLLM and uvicorn stop: on SIGTERM (or a first Ctrl-C) the server drains, then exits.

The drain: new requests are a 503 at once (the listener stays open so clients get an answer, not a refused
connection); the requests in flight get `grace_s` to finish normally, with their final chunk and [DONE]; what is
left is aborted, each open stream ending with a final chunk whose finish_reason is "abort" and an error event
saying the server is shutting down (a waiting non-streaming call gets a 503). No request is answered with a 500.
Then uvicorn's own shutdown runs (close connections, lifespan: the engine thread stops). A second signal during
the drain skips what is left of the grace period. A SIGTERM that drained ends the process with exit code 0 (a stop
asked for and carried out; scripts and supervisors read 143 as a failure); a Ctrl-C still ends as an interrupt.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from refengine.entrypoints.access import Drain
from refengine.entrypoints.serving import OpenAIServing

log = logging.getLogger("refengine.server")
# After the aborts, the streams get this long to write their last chunk before uvicorn closes the connections.
ABORT_FLUSH_S = 2.0


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, serving: OpenAIServing, grace_s: float) -> None:
        super().__init__(config)
        self.drain, self.serving, self.grace_s = drain, serving, grace_s
        self._drain: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._skip_grace = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler (runs between bytecodes of the loop's thread): start the drain, or cut it short."""
        if self._loop is None or self.should_exit:  # not serving yet, or already past the drain: uvicorn's way
            return super().handle_exit(sig, frame)
        if sig != signal.SIGTERM:  # uvicorn raises the captured signals again once it has stopped: Ctrl-C still
            self._captured_signals.append(sig)  # ends as an interrupt, a drained SIGTERM as a clean exit (0)
        self.request_stop()

    def request_stop(self) -> None:
        """What SIGTERM does, from any thread: the first call starts the drain, a second ends its grace period."""
        assert self._loop is not None, "the server has not started"
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._drain is None:
            self.drain.draining = True
            log.info("draining: %d request(s) in flight, %.0f s grace", self.drain.in_flight, self.grace_s)
            self._drain = asyncio.ensure_future(self._drain_then_exit())
        else:
            self._skip_grace.set()

    async def _drain_then_exit(self) -> None:
        try:
            idle = asyncio.ensure_future(self.drain.wait_idle(self.grace_s))
            skip = asyncio.ensure_future(self._skip_grace.wait())
            await asyncio.wait({idle, skip}, return_when=asyncio.FIRST_COMPLETED)
            skip.cancel()
            if not (idle.done() and idle.result()):
                idle.cancel()
                n = self.serving.abort_all("the server is shutting down; the request was aborted")
                log.warning("grace period over: aborted %d call(s)", n)
                await self.drain.wait_idle(ABORT_FLUSH_S)
        finally:
            self.should_exit = True
