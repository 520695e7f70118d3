"""The served clock's time scale (simulated seconds per wall second, at most 1): fixed, or chosen as the run goes
by `ScaleController` so that the host keeps up with the simulated steps (refengine/sim/pacing.py paces by it).

The controller measures the host's cost, wall seconds of host work per simulated second of GPU work, per busy step.
Cost times scale is the share of each step's wall time the host uses. When the median share of the last
SLOW_DOWN_WINDOW steps (one slow step, another process took the core or a garbage collection ran, moves nothing)
passes SLOW_DOWN_SHARE, the scale drops to where it would be TARGET_HOST_SHARE: a burst is caught within a few
steps. It rises only when even the costliest of the last SPEED_UP_WINDOW steps is below SPEED_UP_SHARE, at most
once per SPEED_UP_DWELL_S: the host's work grows with the number of streams, not with the step's length, so a run
of long prefill steps would underrate what the decode steps after them need. The clock starts at
INITIAL_TIME_SCALE and rises from there if the host has room, rather than starting at real time, where the first
burst would be late before the clock could slow down. Two changes are at least MIN_DWELL_S apart: a client that
samples the server's clock more often than that (perf samples /metrics every 0.5 s) sees every change.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

# The share of a step's wall time the adaptive clock leaves to the host's measured work: the rest is headroom for
# what the server does not measure (a client parsing the streams on the same machine, the loop's other work).
TARGET_HOST_SHARE = 0.4
# Slow down once the measured share passes this (the next steps would soon be late), speed up below the other.
SLOW_DOWN_SHARE = 0.7
SPEED_UP_SHARE = 0.2
SLOW_DOWN_WINDOW = 3
SPEED_UP_WINDOW = 16
MIN_DWELL_S = 1.0  # wall seconds between two changes of scale (twice perf's sampling period of the clock)
SPEED_UP_DWELL_S = 5.0  # wall seconds between a change and a rise
# Where the adaptive clock starts: about what a 2-core host kept up with at 256 streams of an 8B model on an H200
# (docs/sim-engine.md); a host with room speeds it up within seconds.
INITIAL_TIME_SCALE = 0.25
MIN_TIME_SCALE = 0.01  # the slowest the adaptive clock runs: 1 simulated second per 100 wall seconds
# A scale is rounded down to this many significant digits, so that it reads the same in logs, headers and metrics.
SCALE_DIGITS = 3


def check_time_scale(time_scale: float | None) -> float | None:
    """A fixed scale in (0, 1] (simulated seconds per wall second), or None: adaptive."""
    if time_scale is not None and not (math.isfinite(time_scale) and 0 < time_scale <= 1):
        raise ValueError(f"time_scale: simulated seconds per wall second, in (0, 1], got {time_scale!r}")
    return time_scale


def _round_down(x: float) -> float:
    unit = 10.0 ** (SCALE_DIGITS - 1 - math.floor(math.log10(x)))
    return math.floor(x * unit) / unit


class ScaleController:
    def __init__(self, started: float, max_scale: float = 1.0) -> None:
        """`started`: the wall time the clock began at `initial` (a first rise waits SPEED_UP_DWELL_S from it; a
        first slow-down waits for nothing)."""
        self.max_scale = max_scale
        self.initial = min(max_scale, INITIAL_TIME_SCALE)
        self._costs: deque[float] = deque(maxlen=SPEED_UP_WINDOW)
        self._changed_at = -math.inf
        self._settled_at = started  # the last change, or the start

    def observe(self, scale: float, host_s: float, step_s: float, wall: float) -> float:
        """The scale after a step of `step_s` simulated seconds that took the host `host_s` wall seconds, at
        wall time `wall`."""
        if step_s <= 0:
            return scale
        costs = self._costs
        costs.append(host_s / step_s)
        if len(costs) < SLOW_DOWN_WINDOW or wall - self._changed_at < MIN_DWELL_S:
            return scale
        recent = statistics.median(list(costs)[-SLOW_DOWN_WINDOW:])
        if recent * scale > SLOW_DOWN_SHARE:
            new = _round_down(TARGET_HOST_SHARE / recent)
        elif len(costs) == SPEED_UP_WINDOW and max(costs) * scale < SPEED_UP_SHARE:
            if wall - self._settled_at < SPEED_UP_DWELL_S:
                return scale
            new = _round_down(TARGET_HOST_SHARE / max(costs)) if max(costs) > 0 else self.max_scale
        else:
            return scale
        new = min(self.max_scale, max(MIN_TIME_SCALE, new))
        if new == scale:
            return scale
        self._costs.clear()  # the next decision waits for a full window measured at the new scale
        self._changed_at = self._settled_at = wall
        return new
