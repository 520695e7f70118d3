"""The gate's decision, per configuration and metric: head against base with the U test (cbbench/perf/stats.py),
corrected for the number of tests, and what each metric's minimum effect is.

A metric regresses when all three hold:
- the change is in the bad direction (throughput down, latency up);
- it is significant: the one-sided p-value is at most alpha = (1 - confidence) / (number of tests), Bonferroni's
  correction. Many metrics of many configurations, each at 95 %, would find a "regression" in a fair share of
  unchanged gates; divided so, the chance that an unchanged tree fails the gate stays at most 1 - confidence
  (tests of correlated metrics make it lower still). Holm's step-down would reject a little more often when several
  metrics truly moved, but its thresholds differ per metric; with Bonferroni every interval printed is the one the
  verdict was read from;
- the ratio is beyond the metric's minimum effect: a real change smaller than that is reported, not failed.

A metric with no regression is "ok" only when its interval's bound on the bad side excludes a change as large as
the minimum effect; otherwise it is "inconclusive", with the smallest change the runs could have seen (that bound,
stats.py's `unseen_change`): an A/A gate whose output-throughput interval is 0.90-1.30 could not have told a 10 %
slowdown from nothing, and says so rather than "no regression". The gate may add runs to such a verdict
(run.py: --max-repeats); each look at the runs is one more chance of a false alarm, so the tests are counted once
per look the gate may take (Bonferroni again), and the level holds however many it takes.

Minimum effects, from weakest to strongest (a later layer overrides an earlier one, pattern by pattern, as
`compare`'s tolerances do): `DEFAULT_MIN_EFFECTS`; `[tool.cbbench.gate.min-effect]` in the pyproject.toml of the
current folder or a parent; each `--min-effect-file` (its `[min-effect]` table); `--min-effect METRIC=REL` (a bare
REL sets every metric gated so far). A name or pattern adds a metric to the gated set, "off" takes one out.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cbbench.perf.results.columns import KEY_NAMES
from cbbench.perf.results.gate import _pyproject, read_tolerance_file
from cbbench.perf.results.matching import label
from cbbench.perf.results.rows import number, with_extra_metrics
from cbbench.perf.results.schema import config_key
from cbbench.perf.results.tolerances import HIGHER, LOWER, direction, resolve_tolerances
from cbbench.perf.stats import log_shift, runs_needed, unseen_change
from refengine.sim.sim_device import DeviceSpec

# What a serving change moves: output throughput, and the mean and median of each latency a client sees per token
# or per request start. p99s and the other throughputs follow the same runs (more tests would only widen every
# interval); add them with --min-effect p99_ttft_ms=5%.
GATED = (
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
)
# The smallest change worth failing: a slowdown of a few percent is what a CI gate exists to catch, and 1.5 % sits
# below the 2 % a simulated planted slowdown makes (throughput 1 / 1.02 = -1.96 %); a real change smaller than this
# is reported as a "small change", not failed.
DEFAULT_MIN_EFFECT = 0.015
DEFAULT_MIN_EFFECTS: dict[str, float] = dict.fromkeys(GATED, DEFAULT_MIN_EFFECT)
# Measured once per run, not per configuration: the CPU seconds (user + system) of the run's whole process, taken by
# the gate from the kernel's accounting. On a shared CPU, contention stretches every wall-clock metric by up to 3x
# from one run to the next while the work a run does, its CPU time, moves by about 2 % (docs/gate.md): a regression
# that adds work shows here long before it shows through the noise of the wall clock. It is gated by default where
# the engine runs on the CPU in-process; a server's (or a GPU's) work is not the client process's.
RUN_METRICS = ("process_cpu_s",)
CPU_MIN_EFFECTS: dict[str, float] = {**DEFAULT_MIN_EFFECTS, "process_cpu_s": DEFAULT_MIN_EFFECT}


def default_min_effects(device: str, servers: bool) -> dict[str, float]:
    """The gated metrics of a gate on `device`: the wall-clock seven, and the runs' CPU time for an in-process CPU."""

    return dict(CPU_MIN_EFFECTS if DeviceSpec.parse(device).is_cpu and not servers else DEFAULT_MIN_EFFECTS)


DEFAULT_CONFIDENCE = 0.95
PYPROJECT_TABLE = ("tool", "cbbench", "gate", "min-effect")
FILE_TABLE = ("min-effect",)
BAD = ("regressed", "missing in head")
INCONCLUSIVE = "inconclusive"


def _rel(text: str, what: str) -> float | None:
    text = text.strip()
    if text == "off":
        return None
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(f'{what}: expected a number, a percentage or "off", got {text!r}') from None
    if not value >= 0 or value == math.inf:
        raise ValueError(f"{what}: must be a finite number >= 0, got {text!r}")
    return value


def min_effects(
    items: Sequence[str] = (),
    files: Sequence[str | os.PathLike[str]] = (),
    *,
    cwd: str | os.PathLike[str] | None = None,
    defaults: Mapping[str, float] = DEFAULT_MIN_EFFECTS,
) -> tuple[dict[str, float], list[str]]:
    """The minimum effect of every gated metric (see the module docstring) and the sources that set any."""
    effects = dict(defaults)
    sources: list[str] = []

    def layer(values: Mapping[str, float | None], source: str) -> None:
        nonlocal effects
        if values:
            sources.append(source)
            effects = resolve_tolerances(values, defaults=effects, what="min-effect")

    py = _pyproject(Path(cwd or os.getcwd()).resolve())
    if py is not None:
        layer(read_tolerance_file(py, PYPROJECT_TABLE), f"{py} [{'.'.join(PYPROJECT_TABLE)}]")
    for f in files:
        if not Path(f).is_file():
            raise ValueError(f"min-effect-file: {f}: no such file")
        layer(read_tolerance_file(f, FILE_TABLE), str(f))
    bare = [i for i in items if "=" not in i]
    named: dict[str, float | None] = {}
    for item in items:
        if "=" in item:
            name, _, value = item.partition("=")
            named[name.strip()] = _rel(value, f"min-effect {name.strip()}")
    for item in bare:
        every = _rel(item, "min-effect")
        layer(dict.fromkeys(effects, every), "--min-effect")
    layer(named, "--min-effect")
    if not effects:
        raise ValueError("min-effect: every metric is off: the gate would test nothing")
    return effects, list(dict.fromkeys(sources))


@dataclass(frozen=True)
class Decision:
    """One metric of one configuration: the arms' medians, the ratio head / base with its interval, the verdict."""

    config: str
    metric: str
    direction: str
    base: float  # median of the base runs
    head: float
    ratio: float  # Hodges-Lehmann head / base
    low: float
    high: float
    p_worse: float  # one-sided p-value of "head is worse"
    min_effect: float
    status: str  # regressed | improved | small change | inconclusive | ok | n/a | missing in head
    n_base: int
    n_head: int
    # the largest change in the bad direction the interval cannot exclude (0.12: 12 %); beyond min_effect, the
    # metric is inconclusive and this is the smallest change these runs could have seen
    unseen: float = math.nan


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _samples(runs: Sequence[Sequence[Mapping[str, object]]], i: int, metric: str) -> list[float]:
    return [v for run in runs if math.isfinite(v := number(run[i].get(metric)))]


def _key(row: Mapping[str, object]) -> tuple[str, ...]:
    """The configuration key, less the arm."""

    return tuple("" if name == "arm" else cell for name, cell in zip(KEY_NAMES, config_key(row)))


def configurations(
    base: Sequence[Sequence[Mapping[str, object]]], head: Sequence[Sequence[Mapping[str, object]]]
) -> list[str]:
    """Each configuration's name, pairing the arms' rows by their place in the run (the same perf options give the
    same plan, whatever each tree resolves its knobs to); ValueError when the arms ran different plans."""
    counts = {len(run) for run in (*base, *head)}
    if len(counts) != 1:
        raise ValueError(f"gate: the runs hold different numbers of configurations ({sorted(counts)})")
    b, h = base[0], head[0]
    for rb, rh in zip(b, h):
        if (rb.get("engine"), rb.get("batching")) != (rh.get("engine"), rh.get("batching")):
            raise ValueError(
                f"gate: the arms ran different plans ({rb.get('engine')} {rb.get('batching')} in base, "
                f"{rh.get('engine')} {rh.get('batching')} in head)"
            )
    keys = [_key(r) for r in h]
    return [label(k, keys) or f"configuration {i + 1}" for i, k in enumerate(keys)]


def key_changes(base_row: Mapping[str, object], head_row: Mapping[str, object]) -> list[str]:
    """`block_size 16 -> 32`: the key columns whose value differs between the arms (a default the change moved)."""

    out = []
    for name, b, h in zip(KEY_NAMES, _key(base_row), _key(head_row)):
        if b != h:
            out.append(f"{name} {b or '-'} -> {h or '-'}")
    return out


def decide(
    base: Sequence[Sequence[Mapping[str, object]]],
    head: Sequence[Sequence[Mapping[str, object]]],
    effects: Mapping[str, float],
    confidence: float = DEFAULT_CONFIDENCE,
    looks: int = 1,
) -> tuple[list[Decision], float]:
    """Every (configuration, metric) decision and the per-test alpha. `base` / `head`: each arm's runs, each run its
    rows in plan order; `looks`: how many times the gate may decide on growing runs (its level is spread over all)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    base = [with_extra_metrics(run) for run in base]
    head = [with_extra_metrics(run) for run in head]
    names = configurations(base, head)
    per_config = {m: e for m, e in effects.items() if m not in RUN_METRICS}
    per_run = {m: e for m, e in effects.items() if m in RUN_METRICS}
    alpha = (1 - confidence) / count_tests(len(names), effects, looks)
    out = []
    for i, name in enumerate(names):
        for metric, effect in per_config.items():
            out.append(_decide(name, metric, _samples(base, i, metric), _samples(head, i, metric), effect, alpha))
    whole = names[0] if len(names) == 1 else f"the whole run ({len(names)} configurations)"
    for metric, effect in per_run.items():  # the same number on every row of a run: one test, from the first
        out.append(_decide(whole, metric, _samples(base, 0, metric), _samples(head, 0, metric), effect, alpha))
    return out, alpha


def count_tests(configs: int, effects: Mapping[str, float], looks: int = 1) -> int:
    """The tests of a gate: each per-configuration metric of each configuration, and each per-run metric once, at
    each of the `looks` the gate may take."""
    runs = sum(m in RUN_METRICS for m in effects)
    return (configs * (len(effects) - runs) + runs) * looks


def _decide(config: str, metric: str, b: list[float], h: list[float], effect: float, alpha: float) -> Decision:
    d = direction(metric)

    def made(
        status: str,
        ratio: float = math.nan,
        low: float = math.nan,
        high: float = math.nan,
        p: float = math.nan,
        unseen: float = math.nan,
    ) -> Decision:
        return Decision(
            config, metric, d, _median(b), _median(h), ratio, low, high, p, effect, status, len(b), len(h), unseen
        )

    if not b or min(b + h, default=1.0) <= 0:
        return made("n/a")  # (no ratio of a zero or negative sample: nothing to decide on)
    if not h:
        return made("missing in head")
    s = log_shift(b, h, alpha)
    p_worse, p_better = (s.p_higher, s.p_lower) if d == LOWER else (s.p_lower, s.p_higher)
    up, down = s.ratio > 1 + effect, s.ratio < 1 - effect
    worse, better = (up, down) if d == LOWER else (down, up)
    if p_worse <= alpha and worse:
        status = "regressed"
    elif p_better <= alpha and better:
        status = "improved"
    elif p_worse <= alpha or p_better <= alpha:
        status = "small change"
    else:
        status = "ok"
    unseen = unseen_change(s, d == LOWER)
    if status in ("ok", "small change") and unseen > effect:
        status = INCONCLUSIVE  # no regression shown, and none as large as the minimum effect ruled out
    return made(status, s.ratio, s.low, s.high, p_worse, unseen)


def regressed(decisions: Sequence[Decision]) -> bool:
    return any(d.status in BAD for d in decisions)


def inconclusive(decisions: Sequence[Decision]) -> bool:
    """No regression, but some metric's runs could not rule out one as large as its minimum effect."""
    return not regressed(decisions) and any(d.status == INCONCLUSIVE for d in decisions)


def check_repeats(repeats: int, tests: int, confidence: float) -> None:  # (tests: count_tests's)
    """ValueError when `repeats` runs per arm can never make a change significant for `tests` tests: such a gate
    would pass whatever the change."""
    alpha = (1 - confidence) / tests
    need = runs_needed(alpha)
    if repeats < need:
        raise ValueError(
            f"repeats: {repeats} run(s) per arm can never show a change at {confidence:.0%} confidence over "
            f"{tests} test(s) (one-sided alpha {alpha:.2g} each); use --repeats {need} or more"
        )


def as_dict(d: Decision) -> dict[str, object]:
    return asdict(d)


__all__ = [
    "BAD",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MIN_EFFECT",
    "DEFAULT_MIN_EFFECTS",
    "RUN_METRICS",
    "count_tests",
    "default_min_effects",
    "Decision",
    "GATED",
    "HIGHER",
    "INCONCLUSIVE",
    "inconclusive",
    "LOWER",
    "as_dict",
    "check_repeats",
    "configurations",
    "decide",
    "key_changes",
    "min_effects",
    "regressed",
]
