"""A served simulated GPU's clock, rebuilt from its /metrics, and an HTTP run's records converted into it.

`cbbench serve --device sim:<gpu>` runs its clock at `scale` simulated seconds per wall second (1: real time, less
where the host cannot keep up; refengine/sim/pacing.py), and its /metrics carries one point of the wall-to-simulated
mapping per scrape (refengine/entrypoints/sim_clock.py): its wall clock, its simulated clock and the scale at one
moment. The mapping is piecewise linear with slope `scale`, and the server changes the scale at most once per
MIN_DWELL_S (2 s) while perf samples every 0.5 s, so between two samples it changed at most once: where the two
samples' scales differ, the change is where the line leaving the first meets the line reaching the second.

The client's clock (time.perf_counter) is matched to the server's wall clock by the smallest difference seen
between a scrape's arrival and the server's reading (the scrape that waited least): an offset error shifts every
converted time alike, so durations keep none of it. The converted records are in simulated seconds, as an
in-process simulated run's, and the run's metrics (TTFT, TPOT, ITL, throughput) come out in simulated time.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from cbbench.perf.records import RequestRecord

CLOCK, WALL, SCALE = "cbbench:sim_clock_seconds", "cbbench:sim_wall_clock_seconds", "cbbench:sim_time_scale"
# Two samples of the same scale whose points do not lie on one line of that slope, by more than this many
# simulated seconds, had two changes between them: the mapping there is interpolated (and `exact` turns False).
LINE_TOLERANCE_S = 1e-6


@dataclass(frozen=True)
class SimClock:
    """Client time -> the server's simulated time. `knots`: (server wall, simulated) points between which the
    mapping is linear; outside them it runs at the first / last scale."""

    offset: float  # client clock minus server wall clock
    knots: tuple[tuple[float, float], ...]
    scales: tuple[float, ...]  # the scale of each sample, in order
    exact: bool  # False where the samples missed a change (the mapping there is interpolated)
    walls: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "walls", tuple(w for w, _ in self.knots))  # (frozen: set once, for bisect)

    @classmethod
    def from_samples(cls, samples: Sequence[tuple[float, float, float, float]]) -> SimClock | None:
        """From (client time, server wall, simulated, scale) per scrape; None without any sample."""
        if not samples:
            return None
        offset = min(client - wall for client, wall, _, _ in samples)
        points = sorted((wall, sim, scale) for _, wall, sim, scale in samples)
        knots, exact = [(points[0][0], points[0][1])], True
        for (w1, v1, r1), (w2, v2, r2) in zip(points, points[1:]):
            if r1 != r2:
                wc = ((v2 - r2 * w2) - (v1 - r1 * w1)) / (r1 - r2)  # where the two lines meet
                if w1 <= wc <= w2:
                    knots.append((wc, v1 + r1 * (wc - w1)))
                else:
                    exact = False
            elif abs(v1 + r1 * (w2 - w1) - v2) > LINE_TOLERANCE_S:
                exact = False
            knots.append((w2, v2))
        return cls(offset, tuple(knots), tuple(p[2] for p in points), exact)

    def to_sim(self, t: float) -> float:
        w = t - self.offset
        i = bisect.bisect_right(self.walls, w) - 1
        if i < 0:
            (w0, v0), scale = self.knots[0], self.scales[0]
            return v0 + scale * (w - w0)
        if i >= len(self.knots) - 1:
            (wn, vn), scale = self.knots[-1], self.scales[-1]
            return vn + scale * (w - wn)
        (wa, va), (wb, vb) = self.knots[i], self.knots[i + 1]
        return va + (vb - va) * (w - wa) / (wb - wa) if wb > wa else va

    @property
    def real_time(self) -> bool:
        """The server's clock ran in real time throughout: there is nothing to convert."""
        return all(s == 1.0 for s in self.scales)

    def mean_scale(self, t0: float, t1: float) -> float:
        """Simulated seconds per wall second between client times t0 and t1."""
        return (self.to_sim(t1) - self.to_sim(t0)) / (t1 - t0) if t1 > t0 else self.scales[-1]

    def convert(self, rec: RequestRecord) -> RequestRecord:
        """The record with every time in simulated seconds."""

        def one(t: float | None) -> float | None:
            return None if t is None else self.to_sim(t)

        def many(ts: list[float] | None) -> list[float] | None:
            return None if ts is None else [self.to_sim(t) for t in ts]

        return dataclasses.replace(
            rec,
            arrival_time=self.to_sim(rec.arrival_time),
            first_scheduled_time=one(rec.first_scheduled_time),
            first_token_time=one(rec.first_token_time),
            token_times=many(rec.token_times),
            finish_time=one(rec.finish_time),
            chunk_times=many(rec.chunk_times),
            scheduled_time=one(rec.scheduled_time),
        )


def time_note(clock: SimClock, t0: float, t1: float) -> str:
    """The line under the table that says the times were converted, and at what scale."""
    lo, hi = min(clock.scales), max(clock.scales)
    span = f"{lo:g}" if lo == hi else f"{lo:g} to {hi:g}"
    how = "" if clock.exact else "; a change of scale fell between two samples, interpolated there"
    return (
        f"times are the server's simulated time: its clock ran at {span} simulated s per wall s "
        f"(mean {clock.mean_scale(t0, t1):.3g}), and the wall-clock times measured were converted{how}"
    )
