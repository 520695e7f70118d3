"""The gate's test: the Mann-Whitney U test on the log of each metric, its Hodges-Lehmann ratio and the interval the
test gives, exact and free of any random draw, so the same samples always give the same verdict.

For one metric, `x` holds the base arm's samples and `y` the head arm's (one per run). On the log scale a change is a
shift: `y = x + d` means head / base = exp(d), whatever the metric's unit. The `m * n` pairwise differences
`y_j - x_i` carry everything the test needs:

- the ratio is exp(their median): the Hodges-Lehmann estimate of the shift, the estimate that goes with the U test;
- the bound on one side is their k-th smallest (largest) difference, where k is the largest count with
  P(U <= k - 1) <= alpha under no change (U's exact distribution for m and n: the Gaussian binomial coefficient's
  coefficients). The bound holds with probability at least 1 - alpha whatever the distribution of the noise;
- "head is worse" is significant at alpha exactly when the bound on the good side excludes no change: for a latency,
  the lower bound is above 1; for a throughput, the upper bound is below 1. The p-value is computed from the same
  count, so the p-value, the interval and the verdict never disagree.

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


def log_shift(base: Sequence[float], head: Sequence[float], alpha: float) -> Shift:
    """The U test of head against base on the log scale, each side at one-sided level `alpha`.

    ValueError when a sample is not a positive finite number (a ratio of it means nothing) or an arm is empty."""
    if not base or not head:
        raise ValueError("gate: an arm has no sample of this metric")
    if not 0 < alpha < 1:
        raise ValueError(f"gate: alpha must be in (0, 1), got {alpha}")
    for v in (*base, *head):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"gate: a sample of {v!r} has no log: the ratio needs positive, finite values")
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
