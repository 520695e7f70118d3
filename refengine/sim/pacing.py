"""StepPacer: serve a simulated GPU in real time, or slowed down by a reported time scale where the host cannot
keep up. A step of X simulated seconds takes X / scale wall seconds (never less), so clients, routers and
autoscalers see a server that behaves like the simulated GPU, at `scale` simulated seconds per wall second.

The pacer maps wall time onto virtual time: virtual(w) = v0 + scale * (w - w0), re-anchored whenever the scale
changes, so the mapping is continuous (a piecewise-linear clock; `reading()` gives one point of it).
- `now()`: the virtual time of this wall moment; the server stamps arrivals with it (safe from any thread: it
  reads one tuple, replaced whole).
- `step()`: after an idle wait (`idle()`), the virtual clock first catches up with the wall, so idle time passes
  in virtual time too. A busy engine's next step starts where the previous one ended, as on a GPU whose host
  work (scheduling, output processing) overlaps its steps: the host's work between two steps is absorbed by the
  pacer's sleep as long as it fits in the step's wall time. Then the engine steps (the runner advances the clock
  by the step's modelled seconds) and the pacer sleeps until the wall reaches the step's end. A host that is late
  anyway does not sleep, and its lateness passes into virtual time (the served timings become the host's).
- The scale is fixed (`time_scale`) or adaptive (None): `ScaleController` (time_scale.py) slows the clock down
  while the host's work per step takes too large a share of the step's wall time and speeds it up again when it
  has room. The host's work is the engine thread's, measured here from when the previous step was due to when
  this one is computed, or the event loop's lag in writing the outputs (`loop_lag`, set by the server), if longer.
Servers report the scale (/metrics, a response header, GET /version) and `cbbench perf --backend openai`
converts what it measured back to simulated time (perf/backends/sim_time.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from refengine.clock import VirtualClock
from refengine.sim.time_scale import ScaleController, check_time_scale

if TYPE_CHECKING:
    from refengine.outputs import RequestOutput


class StepPacer:
    def __init__(
        self,
        clock: VirtualClock,
        step: Callable[[], list[RequestOutput]],
        sleep: Callable[[float], None] | None = None,
        wall: Callable[[], float] | None = None,
        time_scale: float | None = 1.0,
    ) -> None:
        """`sleep` and `wall` (None: this module's `time.sleep` and `time.monotonic`, looked up here rather than
        bound at import, so that a test of a server whose pacer it does not build can hand it a fake wall clock by
        replacing `refengine.sim.pacing.time`)."""
        sleep = time.sleep if sleep is None else sleep
        wall = time.monotonic if wall is None else wall
        self.clock, self._step, self._sleep, self._wall = clock, step, sleep, wall
        self.controller = ScaleController(wall()) if check_time_scale(time_scale) is None else None
        # (w0, v0, scale): replaced as one tuple, so another thread's now() never mixes two mappings
        self._map = (wall(), clock.now(), self.controller.initial if self.controller else time_scale or 1.0)
        self._due: float | None = None  # wall time the last step's outputs were due; None: idle since
        self.loop_lag: Callable[[], float] | None = None  # the server's event-loop lag in writing outputs (s)
        self.host_s = 0.0  # the last step's measured host work (wall seconds)
        self.late = False  # the last step's outputs came out after they were due

    @property
    def scale(self) -> float:
        """Simulated seconds per wall second now (1.0: real time)."""
        return self._map[2]

    def now(self) -> float:
        w0, v0, scale = self._map
        return v0 + scale * (self._wall() - w0)

    def reading(self) -> tuple[float, float, float]:
        """(wall, virtual, scale) at one moment: a point of the wall-to-virtual mapping, for clients to convert."""
        w0, v0, scale = self._map
        w = self._wall()
        return w, v0 + scale * (w - w0), scale

    def idle(self) -> None:
        """The engine has nothing to run: its next step starts from the wall's virtual time."""
        self._due = None

    def _set_scale(self, scale: float, at: float) -> None:
        w0, v0, old = self._map
        if scale != old:
            self._map = (at, v0 + old * (at - w0), scale)

    def step(self) -> list[RequestOutput]:
        if self._due is None:  # after an idle wait (or the first step): idle time passes in virtual time
            self.clock.sleep_until(self.now())
        start = self.clock.now()
        outputs = self._step()
        end = self.clock.now()
        t = self._wall()
        if self._due is not None:  # since the previous step was due: wake-up, outputs, commands, this step
            self.host_s = max(t - self._due, self.loop_lag() if self.loop_lag else 0.0)
            if self.controller is not None:
                self._set_scale(self.controller.observe(self.scale, self.host_s, end - start, t), t)
        w0, v0, scale = self._map
        due = w0 + (end - v0) / scale
        self.late = due <= t
        if not self.late:
            self._sleep(due - t)
        else:  # the host's lateness becomes simulated time
            self.clock.sleep_until(self.now())
            due = t
        self._due = due
        return outputs
