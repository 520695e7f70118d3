"""The gate's decision rule on synthetic samples: the exact U distribution, a known shift caught with an interval that
holds it, noise alone not failing more often than the confidence allows over many gates (which it would without the
correction for the number of tests), ties, directions, minimum effects and their layering, and too few repeats."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from cbbench.perf.gate.verdict import DEFAULT_MIN_EFFECT, GATED, check_repeats, decide, min_effects, regressed
from cbbench.perf.stats import _u_cdf, log_shift, runs_needed, smallest_p

NOISE = 0.03  # run-to-run noise of a metric, as a log-normal sd: a CPU run at low load (docs/gate.md)
SYNTHETIC_GATES = 400  # A/A gates simulated for the false-alarm rate (each 7 metrics, 10 runs per arm)
# The rate over SYNTHETIC_GATES gates may exceed 5 % by chance: 8 % is ~2.7 standard errors above it; without the
# correction a gate of 7 independent tests at 5 % each fails ~30 % of the time
FALSE_ALARM_CEILING = 0.08


def _brute_cdf(m: int, n: int) -> list[float]:
    counts: Counter[int] = Counter()
    for xs in itertools.combinations(range(m + n), m):
        counts[sum(1 for y in range(m + n) if y not in xs for x in xs if y > x)] += 1
    total, run, out = sum(counts.values()), 0, []
    for u in range(m * n + 1):
        run += counts[u]
        out.append(run / total)
    return out


@pytest.mark.parametrize("m, n", [(1, 1), (2, 3), (4, 4), (3, 6), (5, 5)])
def test_exact_u_distribution_is_every_order_counted(m, n):
    assert _u_cdf(m, n) == pytest.approx(_brute_cdf(m, n), abs=1e-12)


def test_fewest_runs_that_can_be_significant():
    assert smallest_p(5, 5) == 1 / 252
    assert runs_needed(0.05) == 3 and runs_needed(0.05 / 7) == 5 and runs_needed(0.05 / 14) == 6


def _runs(rng: random.Random, n: int, level: float, *, metrics=GATED) -> list[list[dict[str, float]]]:
    """n runs of one configuration, each metric at `level` times a reference, log-normal noise."""
    out = []
    for _ in range(n):
        row: dict[str, float] = {"engine": "refengine", "batching": "continuous", "workload": "fixed"}
        for m in metrics:
            tput = m.endswith("throughput")
            row[m] = (100.0 / level if tput else 50.0 * level) * math.exp(rng.gauss(0, NOISE))
        out.append([row])
    return out


def test_a_known_shift_is_caught_and_its_interval_holds_it():
    rng = random.Random(1)
    effects, _ = min_effects(cwd="/")
    decisions, alpha = decide(_runs(rng, 10, 1.0), _runs(rng, 10, 1.10), effects)
    assert alpha == pytest.approx(0.05 / len(GATED))
    assert regressed(decisions)
    for d in decisions:
        assert d.status == "regressed", d
        true = 1 / 1.10 if d.metric.endswith("throughput") else 1.10
        assert d.low <= true <= d.high


def test_noise_alone_fails_no_more_often_than_the_confidence_allows():
    rng = random.Random(2)
    effects, _ = min_effects(cwd="/")
    fails = sum(regressed(decide(_runs(rng, 10, 1.0), _runs(rng, 10, 1.0), effects)[0]) for _ in range(SYNTHETIC_GATES))
    assert fails / SYNTHETIC_GATES <= FALSE_ALARM_CEILING


def test_more_tests_make_each_one_stricter():
    rng = random.Random(3)
    effects, _ = min_effects(cwd="/")
    base, head = _runs(rng, 10, 1.0), _runs(rng, 10, 1.0)
    _, alpha_one = decide(base, head, effects)
    two = [run + [dict(run[0])] for run in base], [run + [dict(run[0])] for run in head]  # two configurations
    decisions, alpha_two = decide(*two, effects)
    assert alpha_two == pytest.approx(alpha_one / 2) and len(decisions) == 2 * len(GATED)


def test_ties_a_and_a_is_exactly_one_and_constant_arms_apart_are_as_significant_as_can_be():
    same = log_shift([100.0] * 5, [100.0] * 5, 0.01)
    assert same.ratio == 1.0 and same.p_higher == 1.0 and same.p_lower == 1.0
    apart = log_shift([100.0] * 5, [102.0] * 5, 0.01)
    assert apart.ratio == pytest.approx(1.02) and apart.low == pytest.approx(1.02) and apart.high == pytest.approx(1.02)
    assert apart.p_higher == pytest.approx(1 / 252) and apart.p_lower == 1.0


def test_the_p_value_and_the_interval_agree():
    rng = random.Random(4)
    for _ in range(200):
        b = [math.exp(rng.gauss(0, 0.05)) for _ in range(rng.randint(3, 9))]
        h = [math.exp(rng.gauss(rng.choice([-0.05, 0, 0.05]), 0.05)) for _ in range(rng.randint(3, 9))]
        s = log_shift(b, h, 0.02)
        assert (s.p_higher <= 0.02) == (s.low > 1.0)
        assert (s.p_lower <= 0.02) == (s.high < 1.0)


def _one(base: list[float], head: list[float], metric: str, effect: float = DEFAULT_MIN_EFFECT):
    rows = [[[{"engine": "e", "batching": "b", metric: v}] for v in side] for side in (base, head)]
    (d,), _ = decide(*rows, {metric: effect})
    return d


def test_directions_a_slower_head_regresses_a_faster_one_improves():
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    slower = [v * 0.9 for v in base]
    assert _one(base, slower, "output_throughput").status == "regressed"
    assert _one(slower, base, "output_throughput").status == "improved"
    assert _one(base, [v * 1.1 for v in base], "mean_ttft_ms").status == "regressed"
    assert _one(base, [v * 0.9 for v in base], "mean_ttft_ms").status == "improved"


def test_a_significant_change_within_the_minimum_effect_is_reported_not_failed():
    base = [100.0, 100.1, 99.9, 100.05, 99.95]
    d = _one(base, [v * 1.01 for v in base], "mean_ttft_ms")  # 1 %, arms apart: significant
    assert d.status == "small change" and d.p_worse <= 0.05
    assert _one(base, [v * 1.01 for v in base], "mean_ttft_ms", effect=0.005).status == "regressed"


def test_missing_metric_in_head_fails_and_absent_in_base_is_na():
    nan = math.nan
    assert _one([1.0] * 5, [nan] * 5, "mean_ttft_ms").status == "missing in head"
    assert _one([nan] * 5, [1.0] * 5, "mean_ttft_ms").status == "n/a"
    assert regressed([_one([1.0] * 5, [nan] * 5, "mean_ttft_ms")])


def test_arms_that_ran_different_plans_are_refused():
    base = [[{"engine": "refengine", "batching": "continuous", "mean_ttft_ms": 1.0}]] * 5
    head = [[{"engine": "refengine", "batching": "static", "mean_ttft_ms": 1.0}]] * 5
    with pytest.raises(ValueError, match="different plans"):
        decide(base, head, {"mean_ttft_ms": 0.01})


def test_too_few_repeats_to_ever_fail_are_refused():
    check_repeats(5, 7, 0.95)
    with pytest.raises(ValueError, match="--repeats 5"):
        check_repeats(4, 7, 0.95)
    with pytest.raises(ValueError, match="--repeats 6"):
        check_repeats(5, 14, 0.95)


def test_min_effect_layers_pyproject_then_files_then_the_command_line(tmp_path):
    effects, sources = min_effects(cwd=tmp_path)
    assert set(effects) == set(GATED) and set(effects.values()) == {DEFAULT_MIN_EFFECT} and sources == []
    (tmp_path / "pyproject.toml").write_text('[tool.cbbench.gate.min-effect]\n"*_ttft_ms" = "5%"\n')
    (tmp_path / "gpu.toml").write_text('[min-effect]\nmean_ttft_ms = 0.02\np99_tpot_ms = "3%"\n')
    effects, sources = min_effects(["median_itl_ms=off", "output_throughput=1%"], [tmp_path / "gpu.toml"], cwd=tmp_path)
    assert effects["median_ttft_ms"] == 0.05  # pyproject (the pattern adds the ttft metrics it matches)
    assert effects["p99_ttft_ms"] == 0.05 and effects["mean_ttft_ms"] == 0.02  # the file is stronger
    assert effects["p99_tpot_ms"] == 0.03 and effects["output_throughput"] == 0.01  # --min-effect is strongest
    assert "median_itl_ms" not in effects
    assert sources == [
        f"{tmp_path / 'pyproject.toml'} [tool.cbbench.gate.min-effect]",
        str(tmp_path / "gpu.toml"),
        "--min-effect",
    ]
    every, _ = min_effects(["2%"], cwd=tmp_path / "gpu.toml")  # a bare value: every metric gated so far
    assert set(every.values()) == {0.02} and "p99_ttft_ms" in every


@pytest.mark.parametrize(
    "items, message",
    [
        (["mean_ttft_ms=fast"], "expected a number"),
        (["mean_ttft_ms=-1%"], ">= 0"),
        (["no_such_metric=1%"], "no known direction"),
        ([f"{m}=off" for m in GATED], "every metric is off"),
    ],
)
def test_bad_min_effects_name_what_is_wrong(tmp_path, items, message):
    with pytest.raises(ValueError, match=message):
        min_effects(items, cwd=tmp_path)


def test_the_runs_cpu_time_is_gated_on_an_in_process_cpu_only_and_once_per_run():
    from cbbench.perf.gate.verdict import RUN_METRICS, count_tests, default_min_effects

    assert set(default_min_effects("cpu", servers=False)) == {*GATED, *RUN_METRICS}
    assert set(default_min_effects("sim:h200", servers=False)) == set(GATED)  # a simulated run's numbers repeat
    assert set(default_min_effects("cpu", servers=True)) == set(GATED)  # the client's CPU is not the server's work
    effects = default_min_effects("cpu", servers=False)
    assert count_tests(3, effects) == 3 * len(GATED) + 1

    def run(cpu: float) -> list[dict[str, float | str]]:
        rows = [{"engine": "e", "batching": b, "process_cpu_s": cpu, "mean_ttft_ms": 50.0} for b in ("x", "y")]
        return rows  # two configurations, one process: the same CPU seconds on both rows

    base = [run(10.0 + 0.01 * i) for i in range(5)]
    head = [run(11.0 + 0.01 * i) for i in range(5)]  # 10 % more work
    decisions, alpha = decide(base, head, {"mean_ttft_ms": 0.015, "process_cpu_s": 0.015})
    cpu = [d for d in decisions if d.metric == "process_cpu_s"]
    assert len(cpu) == 1 and cpu[0].status == "regressed" and cpu[0].config == "the whole run (2 configurations)"
    assert alpha == pytest.approx(0.05 / 3)
