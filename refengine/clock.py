"""The engine's clock: every timestamp the engine records (arrival, scheduled, first token, each token, finish, step
stats) is read from one clock object, `engine.clock`.

- `WallClock`: time.monotonic(), for real devices (the CPU and CUDA engines).
- `VirtualClock`: simulated GPU time for `device="sim:<gpu>"`; it stands still while the host works and moves only
  when the simulated runner advances it by a step's modelled seconds, or when a driver waits for a future arrival.

A driver that replays arrivals (the perf runner, a test) reads `clock.now()` and calls `clock.sleep_until(t)` when
the engine is idle until `t`: the wall clock sleeps, the virtual clock jumps there at once.
"""

from __future__ import annotations

import math
import time


class WallClock:
    """time.monotonic(), the clock of the real engine."""

    simulated = False

    @staticmethod
    def now() -> float:
        return time.monotonic()

    @staticmethod
    def sleep_until(t: float) -> None:
        delay = t - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class VirtualClock:
    """Simulated seconds since the engine was built; monotone by construction (it only ever moves forward)."""

    simulated = True

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if not (seconds >= 0 and math.isfinite(seconds)):  # (also rejects NaN)
            raise ValueError(f"a clock advances by a finite non-negative number of seconds, got {seconds!r}")
        self._now += seconds

    def sleep_until(self, t: float) -> None:
        """Idle until `t`: the clock jumps there (it never goes back)."""
        if t > self._now:
            self._now = float(t)


WALL_CLOCK = WallClock()
