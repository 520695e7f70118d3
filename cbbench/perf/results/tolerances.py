"""The gate's tolerance rules: which way each metric is better, the default tolerances, and reading overrides.

A tolerance is relative (0.05 = 5 %); overrides name a metric or an fnmatch pattern ("*_ttft_ms") and may be
"off" (None). compare.py applies them; gate.py layers them from pyproject, the baseline's sidecar and the command line.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from cbbench.perf.results.columns import LATENCY_COLUMNS, THROUGHPUT_COLUMNS

HIGHER = "higher"
LOWER = "lower"
DIRECTIONS: dict[str, str] = {
    **dict.fromkeys(THROUGHPUT_COLUMNS, HIGHER),
    **dict.fromkeys(LATENCY_COLUMNS, LOWER),
    "prefix_cache_hit_rate": HIGHER,
    "mean_slot_utilisation": HIGHER,
    "mean_token_budget_utilisation": HIGHER,
    "num_preemptions": LOWER,
    "recomputed_tokens": LOWER,
    "peak_kv_blocks": LOWER,
    "peak_kv_usage": LOWER,
    "slot_waste": LOWER,
    "duration": LOWER,
    # `cbbench gate`: the CPU seconds of a run's whole process (user + system), what a CPU engine's work costs
    "process_cpu_s": LOWER,
    # schema 5: the client's achieved rate and the steady-state window (its latencies are `*_ms`, so LOWER)
    "achieved_request_rate": HIGHER,
    "steady_output_throughput": HIGHER,
    "steady_state_duration": HIGHER,
}
THROUGHPUT_TOLERANCE = 0.05
LATENCY_TOLERANCE = 0.10  # latency percentiles move more between runs than throughput does
DEFAULT_TOLERANCES: dict[str, float] = {
    **dict.fromkeys(
        ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput"), THROUGHPUT_TOLERANCE
    ),
    **{f"{s}_{m}_ms": LATENCY_TOLERANCE for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p99")},
}


def direction(metric: str) -> str:
    """HIGHER or LOWER is better; any other `*_ms` key (an extra percentile) is a latency."""
    if metric in DIRECTIONS:
        return DIRECTIONS[metric]
    if metric.endswith("_ms"):
        return LOWER
    raise ValueError(f"tolerance: no known direction for metric {metric!r}")


def resolve_tolerances(
    overrides: Mapping[str, float | None] | None = None,
    *,
    defaults: Mapping[str, float] = DEFAULT_TOLERANCES,
    what: str = "tolerance",
) -> dict[str, float]:
    """`defaults` updated by `overrides`: keys are metric names or fnmatch patterns ("*_ttft_ms"), values relative
    tolerances (0.05 = 5 %) or None to stop gating the metric. `cbbench gate` resolves its minimum effects so
    (`what` names them in an error)."""
    tol = dict(defaults)
    for pattern, value in (overrides or {}).items():
        names = [m for m in DIRECTIONS if fnmatch.fnmatchcase(m, pattern)] or [pattern]
        for m in names:
            direction(m)
            if value is None:
                tol.pop(m, None)
            elif not value >= 0:
                raise ValueError(f"{what} for {m} must be >= 0, got {value}")
            else:
                tol[m] = float(value)
    return tol


def parse_tolerances(items: Sequence[str]) -> dict[str, float | None]:
    """CLI form: ["p99_ttft_ms=0.2", "*_throughput=3%", "mean_itl_ms=off"]."""
    out: dict[str, float | None] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"tolerance: expected METRIC=VALUE, got {item!r}")
        value = value.strip()
        out[name.strip()] = None if value == "off" else float(value[:-1]) / 100 if value.endswith("%") else float(value)
    return out
