"""StepPacer: serve a simulated GPU in real time. Each engine step is paced so that the wall clock keeps up with
the virtual clock: a step of X simulated ms takes about X wall ms (never less), so clients, routers and
autoscalers see a server that behaves like the simulated GPU.

The pacer maps wall time onto virtual time from the moment it is built: virtual(w) = v0 + (w - w0).
- `now()`: the virtual time of this wall moment; the server stamps arrivals with it (safe from any thread: it
  reads only the wall clock).
- `step()`: first the clock catches up with the wall (idle time and the host's own work pass in virtual time
  too), then the engine steps (the runner advances the clock by the step's modelled seconds), then the pacer
  sleeps until the wall reaches the virtual clock. When the host is slower than the simulated step, nothing
  sleeps and the next step's catch-up absorbs the lag, so virtual time never runs ahead of the wall.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from refengine.sim.clock import VirtualClock

if TYPE_CHECKING:
    from refengine.outputs import RequestOutput


class StepPacer:
    def __init__(
        self,
        clock: VirtualClock,
        step: Callable[[], list[RequestOutput]],
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock, self._step, self._sleep, self._wall = clock, step, sleep, wall
        self._w0, self._v0 = wall(), clock.now()

    def now(self) -> float:
        return self._v0 + (self._wall() - self._w0)

    def step(self) -> list[RequestOutput]:
        self.clock.sleep_until(self.now())
        outputs = self._step()
        delay = self.clock.now() - self.now()
        if delay > 0:
            self._sleep(delay)
        return outputs
