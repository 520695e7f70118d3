"""Steady-state figures of one run: throughput and latencies over the window where the server held its load, beside
the whole run's (which include the ramp-up and the drain: with every request sent at t0, the last seconds run a
handful of requests).

The window (vLLM's Rust bench client's definition): requests in flight at time t are those sent and not yet
finished (completed requests, from their records: `arrival_time` to `finish_time`); the window is the longest
stretch of time over which they stay at least `STEADY_FRACTION` x the run's maximum. Over it:
- `steady_output_throughput`: output tokens produced inside the window / its length (a token is placed at its own
  time; an HTTP record's streamed chunk may carry several tokens, so its output_len is spread evenly over its
  chunks);
- TTFT over the requests sent inside the window; TPOT over those whose first token and finish both fall inside;
  ITL over the gaps whose two ends fall inside; each as mean, median and p99 (`steady_<stat>_<metric>_ms`).
`steady_state_duration` is the window's length in seconds. Every time is the records' own, so in-process and HTTP
runs alike have it.

No usable window is not a failed run: the figures are NaN and `steady_state_note` says why (no request completed,
never two requests in flight at once, or no token produced inside the window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.perf.metrics import NOT_COMPLETED
from cbbench.perf.records import RequestRecord

# vLLM's Rust bench client: in flight at least 0.95 x the maximum
STEADY_FRACTION = 0.95
# one request in flight at a time is no load to hold steady: the window would be one request's life
MIN_PEAK_IN_FLIGHT = 2
STEADY_METRICS = ("ttft", "tpot", "itl")
STEADY_STATS = ("mean", "median", "p99")
STEADY_COLUMNS = (
    "steady_state_duration",
    "steady_output_throughput",
    *(f"steady_{s}_{m}_ms" for m in STEADY_METRICS for s in STEADY_STATS),
)
NOTE_COLUMN = "steady_state_note"


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    peak: int  # the most requests in flight at once


def _completed(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.finish_time is not None and r.finish_reason not in NOT_COMPLETED]


def in_flight_window(records: Sequence[RequestRecord]) -> Window | str:
    """The steady-state window of a run's completed records, or the reason there is none."""
    done = _completed(records)
    if not done:
        return "no usable steady-state window: no request completed"
    events = sorted([(r.arrival_time, 1) for r in done] + [(float(r.finish_time or 0.0), -1) for r in done])
    level, after = 0, {}  # time -> in flight from that time on (events at one instant count together)
    for t, step in events:
        level += step
        after[t] = level
    levels = list(after.items())
    peak = max(n for _, n in levels)
    if peak < MIN_PEAK_IN_FLIGHT:
        return "no usable steady-state window: never two requests in flight at once"
    floor = STEADY_FRACTION * peak
    best: tuple[float, float] | None = None
    start: float | None = None
    for t, n in levels:
        if n >= floor and start is None:
            start = t
        elif n < floor and start is not None:
            if best is None or t - start > best[1] - best[0]:
                best = (start, t)
            start = None
    if best is None or best[1] <= best[0]:
        return f"no usable steady-state window: {peak} in flight at most, and never for any time"
    return Window(best[0], best[1], peak)


def _token_times(r: RequestRecord) -> list[tuple[float, float]]:
    """(time, tokens) of each output token or streamed chunk of a record."""
    if r.token_times is not None:
        return [(t, 1.0) for t in r.token_times]
    chunks = r.chunk_times or []
    return [(t, r.output_len / len(chunks)) for t in chunks] if chunks else []


def _stats(values_s: Sequence[float], metric: str) -> dict[str, float]:
    keys = [f"steady_{s}_{metric}_ms" for s in STEADY_STATS]
    if not values_s:
        return dict.fromkeys(keys, math.nan)
    import numpy as np

    ms = np.asarray(values_s, dtype=np.float64) * 1000.0
    return dict(zip(keys, (float(np.mean(ms)), float(np.median(ms)), float(np.percentile(ms, 99)))))


def steady_metrics(records: Sequence[RequestRecord]) -> dict[str, float | str]:
    """STEADY_COLUMNS and NOTE_COLUMN of one run (see the module docstring)."""
    w = in_flight_window(records)
    if isinstance(w, str):
        return {**dict.fromkeys(STEADY_COLUMNS, math.nan), NOTE_COLUMN: w}
    a, b = w.start, w.end
    done = _completed(records)
    tokens = sum(n for r in done for t, n in _token_times(r) if a <= t <= b)
    if tokens == 0:
        return {
            **dict.fromkeys(STEADY_COLUMNS, math.nan),
            NOTE_COLUMN: "no usable steady-state window: no token "
            f"was produced inside it ({b - a:.3g} s at {w.peak} in flight)",
        }
    ttft = [
        r.first_token_time - r.arrival_time for r in done if r.first_token_time is not None and a <= r.arrival_time <= b
    ]
    tpot = [
        (r.finish_time - r.first_token_time) / (r.output_len - 1)
        for r in done
        if r.first_token_time is not None
        and r.finish_time is not None
        and r.output_len > 1
        and a <= r.first_token_time
        and r.finish_time <= b
    ]
    itl = []
    for r in done:
        ts = r.token_times if r.token_times is not None else r.chunk_times or []
        itl += [y - x for x, y in zip(ts, ts[1:]) if a <= x and y <= b]
    out: dict[str, float | str] = {"steady_state_duration": b - a, "steady_output_throughput": tokens / (b - a)}
    for m, vals in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        out.update(_stats(vals, m))
    out[NOTE_COLUMN] = ""
    return out
