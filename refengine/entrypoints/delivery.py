"""How the engine thread hands each step's outputs to the event loop: ONE `call_soon_threadsafe` per step that puts
every stream's output on its asyncio queue, so the per-token overhead does not grow with the number of streams.

It also measures the loop's lag in writing them: the time from the hand-over to when the streams it woke have run
(a callback queued after theirs). A paced simulated engine counts that lag as host work per step
(refengine/sim/pacing.py): a loop that cannot write a step's chunks within the step's wall time is a host that
does not keep up, even when the engine thread itself does.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

Delivery = tuple[asyncio.Queue[Any], Any]  # (a stream's queue, what it receives)


class OutputHandoff:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._written_lag_s = 0.0  # the last step's
        self._unwritten_since: float | None = None  # the oldest hand-over not yet written
        self._all_written = threading.Event()
        self._all_written.set()

    def deliver(self, deliveries: list[Delivery]) -> None:
        """(engine thread) Put every (queue, item) in one callback on the loop."""
        loop, sent = self.loop, time.monotonic()
        assert loop is not None, "the server has not started"

        def put_all() -> None:
            for queue, item in deliveries:
                queue.put_nowait(item)
            loop.call_soon(self._written, sent)  # runs after the streams it woke (they were queued first)

        if self._unwritten_since is None:
            self._unwritten_since = sent
        self._all_written.clear()
        try:
            loop.call_soon_threadsafe(put_all)
        except RuntimeError:  # the loop closed (shutdown): nobody is listening any more
            self._all_written.set()

    def _written(self, sent: float) -> None:
        self._written_lag_s, self._unwritten_since = time.monotonic() - sent, None
        self._all_written.set()

    def wait_written(self, timeout: float) -> None:
        """(engine thread) Wait, at most `timeout` seconds, until the loop has written every output handed over."""
        self._all_written.wait(timeout)

    def lag(self) -> float:
        """(any thread) Seconds the loop took to write the last step's outputs, or has been taking for one
        still waiting, whichever is longer."""
        since = self._unwritten_since
        return max(self._written_lag_s, time.monotonic() - since if since is not None else 0.0)
