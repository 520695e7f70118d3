"""The one rule that picks a value axis for the pictures of a run: `cbbench report`'s TTFT and ITL CDFs (the page's
script draws the axis this module chooses) and `cbbench plot`'s latency and throughput axes.

A run's batching modes can sit decades apart: `none` serves one request at a time, so its last TTFT is the sum of
every request before it, decades past what `continuous` keeps its requests waiting; on a linear axis to `none`'s
largest value every other mode's curve fits in the first pixels. So an axis is logarithmic when the plotted values
spread over more than two decades (largest / smallest positive value > LOG_SPREAD), and linear otherwise, where it
reads more directly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

# more than two decades between the smallest and the largest positive value: a linear axis would give the values
# of the lowest decade under 1% of its length
LOG_SPREAD = 100.0
# a log axis ends at least this factor beyond the values: a CDF that rises at its smallest value is drawn clear of
# the y axis's line, not on it
LOG_EDGE_MARGIN = 1.25
MAX_TICKS = 6  # labelled ticks per axis: enough to read a value off, few enough for 600 px of plain numbers
_NICE_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Axis:
    """A value axis: its scale, its range (every value lies inside it) and its labelled ticks; `minor` are the
    unlabelled grid lines of a log axis (2..9 times each power of ten)."""

    scale: Literal["linear", "log"]
    lo: float
    hi: float
    ticks: tuple[float, ...]
    minor: tuple[float, ...] = ()

    def position(self, v: float) -> float:
        """Where `v` sits along the axis: 0 at `lo`, 1 at `hi`. A log axis draws zero and negative values (a zero
        inter-token gap) at its low end."""
        if self.scale == "log":
            lo, hi = math.log10(self.lo), math.log10(self.hi)
            return (math.log10(max(v, self.lo)) - lo) / (hi - lo)
        return (v - self.lo) / (self.hi - self.lo)

    def to_json(self) -> dict[str, object]:
        return {"scale": self.scale, "lo": self.lo, "hi": self.hi, "ticks": list(self.ticks), "minor": list(self.minor)}


def spread(values: Iterable[float]) -> float:
    """Largest over smallest positive finite value (1.0 when there are fewer than two distinct ones)."""
    pos = [v for v in values if math.isfinite(v) and v > 0]
    return max(pos) / min(pos) if pos else 1.0


def choose_axis(values: Iterable[float]) -> Axis:
    """The axis for these values (see the module docstring): log when `spread` > LOG_SPREAD, from the 1, 2 or 5 times
    a power of ten at or below the smallest positive value (less LOG_EDGE_MARGIN) to the one at or above the largest
    (plus the margin), ticks at the powers of ten; linear otherwise, from 0 (or the smallest value, when negative) to a round tick at or above the largest."""
    finite = [float(v) for v in values if math.isfinite(v)]
    if spread(finite) > LOG_SPREAD:
        pos = [v for v in finite if v > 0]
        lo, hi = _log_round(min(pos) / LOG_EDGE_MARGIN, down=True), _log_round(max(pos) * LOG_EDGE_MARGIN, down=False)
        lo_e, hi_e = math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9)
        every = math.ceil((hi_e - lo_e + 1) / (MAX_TICKS + 2))  # at most 8 decade labels; more would collide
        ticks = tuple(10.0**e for e in range(lo_e, hi_e + 1) if (e - lo_e) % every == 0)
        minor = tuple(m * 10.0**e for e in range(lo_e - 1, hi_e + 1) for m in range(2, 10) if lo <= m * 10.0**e <= hi)
        return Axis("log", lo, hi, _rounded(ticks), _rounded(minor))
    lo = min([0.0, *finite])
    hi = max([lo, *finite])
    ticks = nice_ticks(lo, hi)
    return Axis("linear", ticks[0], ticks[-1], ticks)


def _log_round(v: float, down: bool) -> float:
    """The nearest 1, 2 or 5 times a power of ten at or below `v` (down) or at or above it: a log axis's end, so
    that it wastes less than half a decade on either side."""
    e = math.floor(math.log10(v))
    steps = [m * 10.0**k for k in (e - 1, e, e + 1) for m in (1.0, 2.0, 5.0)]
    return max(s for s in steps if s <= v * (1 + 1e-12)) if down else min(s for s in steps if s >= v * (1 - 1e-12))


def nice_ticks(lo: float, hi: float, n: int = MAX_TICKS) -> tuple[float, ...]:
    """Round steps (1, 2, 2.5 or 5 times a power of ten), from the last at or below `lo` to the first at or above
    `hi`, about `n` of them; an empty range gets one step."""
    if not hi > lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(f * mag for f in _NICE_STEPS if f * mag >= raw)
    first = math.floor(lo / step)
    last = math.ceil(hi / step - 1e-9)
    return _rounded(tuple(k * step for k in range(first, last + 1)))


def _rounded(values: tuple[float, ...]) -> tuple[float, ...]:
    """Ticks without float noise (0.30000000000000004 -> 0.3), as the labels print them."""
    return tuple(float(f"{v:.12g}") for v in values)
