"""The statistics every ratio of cbbench is read with: the gate's verdicts, `compare` of two files that hold repeats,
and each ratio `cbbench perf` prints (÷ static, refengine ÷ a peer). One test: the Mann-Whitney U test on the log of
a metric, its Hodges-Lehmann ratio and the interval the test gives, exact and free of any random draw, so the same
samples always give the same answer. It sits at the bottom of `cbbench.perf` (it imports nothing of cbbench), so
`results/`, `report/` and `gate/` all import it without a cycle.

For one metric, `x` holds the base arm's samples and `y` the head arm's (one per run). On the log scale a change is a
shift: `y = x + d` means head / base = exp(d), whatever the metric's unit. The `m * n` pairwise differences
`y_j - x_i` carry everything the test needs:

- the ratio is exp(their median): the Hodges-Lehmann estimate of the shift, the estimate that goes with the U test;
- the bound on one side is their k-th smallest (largest) difference, where k is the largest count with
  P(U <= k - 1) <= alpha under no change (U's exact distribution for m and n: the Gaussian binomial coefficient's
  coefficients). The bound holds with probability at least 1 - alpha whatever the distribution of the noise;
- "head is worse" is significant at alpha exactly when the bound on the good side excludes no change: for a latency,
  the lower bound is above 1; for a throughput, the upper bound is below 1. The p-value is computed from the same
  count, so the p-value, the interval and the verdict never disagree;
- "no change worth failing" needs the other bound: a run shows no regression only when its bound on the bad side
  excludes a change as large as the minimum effect (`unseen_change`); otherwise it is inconclusive, and that bound is
  the smallest change it could have seen (Chromium pinpoint's "need more runs").

Ties (a simulated device gives every run of an arm the same number) count against significance: an A/A pair of
identical samples has ratio exactly 1.0 and p = 1; two arms each constant and apart are as far apart as U can see,
p = 1 / C(m + n, m). Google Benchmark's compare.py uses the same U test over repetitions; asv and pinpoint look for
the same thing (a shift larger than noise between interleaved runs).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@functools.lru_cache(maxsize=256)
def _u_cdf(m: int, n: int) -> tuple[float, ...]:
    """P(U <= u) for u = 0 .. m*n under no change, U the count of pairs in which the head sample is the larger.

    The counts of U over the C(m + n, m) equally likely orders are the coefficients of the Gaussian binomial
    coefficient [m + n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i), computed here in exact integers."""
    poly = [1] + [0] * (m * n)
    for i in range(1, m + 1):
        for k in range(m * n, n + i - 1, -1):  # times (1 - q^(n+i))
            poly[k] -= poly[k - n - i]
        for k in range(i, m * n + 1):  # divided by (1 - q^i): exact, every intermediate is a polynomial
            poly[k] += poly[k - i]
    total = math.comb(m + n, m)
    out, run = [], 0
    for c in poly:
        run += c
        out.append(run / total)
    return tuple(out)


def smallest_p(m: int, n: int) -> float:
    """The smallest one-sided p-value the test can give with m and n samples (the arms entirely apart)."""
    return 1 / math.comb(m + n, m)


def runs_needed(alpha: float) -> int:
    """The fewest runs per arm with which a change can be significant at one-sided level `alpha`."""
    n = 1
    while smallest_p(n, n) > alpha:
        n += 1
    return n


def _critical_count(m: int, n: int, alpha: float) -> int:
    """The largest k with P(U <= k - 1) <= alpha (0: no k, so no bound below infinity at this level)."""
    cdf = _u_cdf(m, n)
    k = 0
    while k < len(cdf) and cdf[k] <= alpha:
        k += 1
    return k


@dataclass(frozen=True)
class Shift:
    """head / base for one metric: the ratio, its interval at the test's level, and the one-sided p-values."""

    ratio: float  # exp(Hodges-Lehmann shift of the logs)
    low: float  # 0.0 when the samples are too few for a bound at this level
    high: float  # inf likewise
    p_higher: float  # P(a head this much higher | no change): small when head is significantly higher
    p_lower: float
    n_base: int
    n_head: int

    @property
    def bounded(self) -> bool:
        """Whether the samples were enough for an interval at the level asked (a single run never is)."""
        return self.low > 0 and math.isfinite(self.high)

    @property
    def within_noise(self) -> bool:
        """The interval holds 1: these runs cannot tell head from base (an unbounded interval holds 1 too)."""
        return self.low <= 1 <= self.high


def log_shift(base: Sequence[float], head: Sequence[float], alpha: float) -> Shift:
    """The U test of head against base on the log scale, each side at one-sided level `alpha`.

    ValueError when a sample is not a positive finite number (a ratio of it means nothing) or an arm is empty."""
    if not base or not head:
        raise ValueError("stats: an arm has no sample of this metric")
    if not 0 < alpha < 1:
        raise ValueError(f"stats: alpha must be in (0, 1), got {alpha}")
    for v in (*base, *head):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"stats: a sample of {v!r} has no log: the ratio needs positive, finite values")
    xs = [math.log(v) for v in base]
    ys = [math.log(v) for v in head]
    diffs = sorted(y - x for x in xs for y in ys)
    m, n, size = len(xs), len(ys), len(diffs)
    mid = size // 2
    median = diffs[mid] if size % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    cdf = _u_cdf(m, n)
    not_higher = sum(d <= 0 for d in diffs)  # ties count against "higher"
    not_lower = sum(d >= 0 for d in diffs)
    k = _critical_count(m, n, alpha)
    low = math.exp(diffs[k - 1]) if k else 0.0
    high = math.exp(diffs[size - k]) if k else math.inf
    return Shift(
        ratio=math.exp(median), low=low, high=high, p_higher=cdf[not_higher], p_lower=cdf[not_lower], n_base=m, n_head=n
    )


# The level of every interval `cbbench perf`, `show` and the report print beside a ratio: two-sided 95 %, each bound
# at one-sided 2.5 % (the gate divides its own level among its tests: verdict.py).
RATIO_CONFIDENCE = 0.95


def side_alpha(confidence: float) -> float:
    """The one-sided level of each bound of a two-sided interval at `confidence`."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return (1 - confidence) / 2


def ratio_interval(base: Sequence[float], head: Sequence[float], confidence: float = RATIO_CONFIDENCE) -> Shift:
    """head / base with its two-sided interval at `confidence` (`log_shift` with each side at half the rest)."""
    return log_shift(base, head, side_alpha(confidence))


def repeats_for_interval(confidence: float = RATIO_CONFIDENCE) -> int:
    """The fewest runs per side with which a two-sided interval at `confidence` has both bounds."""
    return runs_needed(side_alpha(confidence))


def unseen_change(s: Shift, lower_is_better: bool) -> float:
    """The largest change in the bad direction the interval cannot exclude, relative (0.12: 12 %), or 0.0 when the
    interval excludes every bad change: for a latency (lower is better) the upper bound over 1, for a throughput 1
    less the lower bound. A run that shows "no regression" must have this below the minimum effect; otherwise it is
    the smallest change the run could have seen."""
    if lower_is_better:
        return max(s.high - 1, 0.0)
    return max(1 - s.low, 0.0)


def describe_ratio(s: Shift, confidence: float = RATIO_CONFIDENCE, *, short: bool = False) -> str:
    """`1.23x (1.10-1.38)`, `1.02x (0.95-1.10, within noise)`, or, without enough runs for a bound,
    `1.02x (1 run each: no interval)`: how a ratio is printed in sentences (the notes under a table, a report).
    `short`, for a table's cell: `1.23x 1.10-1.38`, `1.02x 0.95-1.10 noise`, `1.02x (1 run)`."""
    if short:
        if not s.bounded:
            n = min(s.n_base, s.n_head)
            return f"{s.ratio:.2f}x ({n} run{'s' if n != 1 else ''})"
        return f"{s.ratio:.2f}x {s.low:.2f}-{s.high:.2f}" + (" noise" if s.within_noise else "")
    if not s.bounded:
        n = min(s.n_base, s.n_head)
        need = repeats_for_interval(confidence)
        why = "no interval" if n == 1 else f"no {confidence:.0%} interval below {need}"
        return f"{s.ratio:.2f}x ({n} run{'s' if n != 1 else ''} each: {why})"
    noise = ", within noise" if s.within_noise else ""
    return f"{s.ratio:.2f}x ({s.low:.2f}-{s.high:.2f}{noise})"
