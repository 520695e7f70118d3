"""The statistics shared by `perf`, `compare` and the gate (cbbench/perf/stats.py), on synthetic samples with a known
shift: each ratio's interval holds the true ratio and excludes 1 when the shift is real, holds 1 ("within noise")
when there is none, and a single run has no interval; the gate and `compare` tell a regression, "no regression" and
"inconclusive" apart (the last with the smallest change the runs could have seen); the plan runs its configurations
interleaved, alternately forward and backward (the gate's ABBA for any number of configurations); and the table,
the notes under it, the markdown and the JSON all print each ratio with its interval."""

from __future__ import annotations

import io
import json
import math
import random

import pytest
from rich.console import Console

from cbbench.perf.gate.report import message, verdict_word
from cbbench.perf.gate.run import BLOCK, GateOptions, looks
from cbbench.perf.gate.verdict import count_tests, decide, inconclusive, regressed
from cbbench.perf.plan.spec import interleaved
from cbbench.perf.report.show import render
from cbbench.perf.report.table import NO_INTERVAL, RATIO_LEGEND, summary_lines, table_columns
from cbbench.perf.stats import RATIO_CONFIDENCE, describe_ratio, ratio_interval, repeats_for_interval, unseen_change

NOISE = 0.03  # run-to-run noise as a log-normal sd: a CPU run at low load (docs/gate.md)
TRIALS = 200  # synthetic experiments per coverage check
# The interval's coverage over TRIALS experiments may fall below 95 % by chance: 90 % is ~3 standard errors below
# (the exact U interval is conservative: its true coverage is at least 95 %)
COVERAGE_FLOOR = 0.90


def _samples(rng: random.Random, n: int, level: float) -> list[float]:
    return [100.0 * level * math.exp(rng.gauss(0, NOISE)) for _ in range(n)]


def test_a_known_shift_has_an_interval_that_holds_it_and_excludes_1():
    rng = random.Random(11)
    held = excluded_one = 0
    for _ in range(TRIALS):
        s = ratio_interval(_samples(rng, 6, 1.0), _samples(rng, 6, 1.25))
        held += s.low <= 1.25 <= s.high
        excluded_one += not s.within_noise
    assert held / TRIALS >= COVERAGE_FLOOR
    assert excluded_one == TRIALS  # 25 % against 3 % noise: never "within noise" with 6 runs a side


def test_no_shift_is_within_noise_and_says_so():
    rng = random.Random(12)
    within = sum(ratio_interval(_samples(rng, 6, 1.0), _samples(rng, 6, 1.0)).within_noise for _ in range(TRIALS))
    assert within / TRIALS >= COVERAGE_FLOOR
    s = ratio_interval([100.0, 103.0, 98.0, 101.0], [99.0, 102.0, 100.0, 104.0])
    assert s.bounded and s.within_noise and describe_ratio(s).endswith("within noise)")


def test_the_ratio_is_hodges_lehmann_and_the_bounds_are_pairwise_ratios():
    base, head = [100.0, 110.0, 105.0, 95.0], [150.0, 160.0, 140.0, 155.0]
    s = ratio_interval(base, head)
    ratios = sorted(h / b for b in base for h in head)
    assert s.ratio == pytest.approx(math.sqrt(ratios[7] * ratios[8]))  # the median of 16 on the log scale
    assert (s.low, s.high) == (pytest.approx(ratios[0]), pytest.approx(ratios[-1]))  # 4 a side at 95 %: k = 1
    assert describe_ratio(s) == f"{s.ratio:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


def test_a_single_run_has_no_interval_and_says_so():
    s = ratio_interval([100.0], [120.0])
    assert not s.bounded and s.ratio == pytest.approx(1.2)
    assert describe_ratio(s) == "1.20x (1 run each: no interval)"
    few = ratio_interval([100.0, 101.0, 99.0], [120.0, 121.0, 119.0])
    assert not few.bounded and "3 runs each: no 95% interval below 4" in describe_ratio(few)
    assert repeats_for_interval(RATIO_CONFIDENCE) == 4  # 1 / C(8, 4) = 0.014 <= 0.025 < 1 / C(6, 3)


def test_unseen_change_is_the_bad_sides_bound():
    s = ratio_interval([100.0, 102.0, 98.0, 101.0, 99.0], [90.0, 110.0, 95.0, 105.0, 100.0])
    assert unseen_change(s, lower_is_better=False) == pytest.approx(1 - s.low)
    assert unseen_change(s, lower_is_better=True) == pytest.approx(s.high - 1)
    faster = ratio_interval([100.0, 101.0, 99.0, 100.5], [150.0, 151.0, 149.0, 150.5])
    assert unseen_change(faster, lower_is_better=False) == 0.0  # every bad change ruled out


# --- the gate's three verdicts ---


def _gate_runs(values: list[float]) -> list[list[dict[str, float | str]]]:
    return [[{"engine": "refengine", "batching": "continuous", "output_throughput": v}] for v in values]


def _decide(base: list[float], head: list[float], effect: float = 0.015):
    (d,), _ = decide(_gate_runs(base), _gate_runs(head), {"output_throughput": effect})
    return d


def test_gate_regression_no_regression_and_inconclusive():
    rng = random.Random(13)
    quiet = _samples(rng, 10, 1.0)
    slower = [v * 0.8 for v in _samples(rng, 10, 1.0)]
    d = _decide(quiet, slower)
    assert d.status == "regressed" and verdict_word([d]) == "FAIL"
    # no change, noise far below the minimum effect: the interval rules out a 10 % slowdown
    tight = [100.0 + 0.1 * i for i in range(10)]
    d = _decide(tight, list(reversed(tight)), effect=0.10)
    assert d.status == "ok" and d.unseen < 0.10 and verdict_word([d]) == "PASS" and not inconclusive([d])
    # no change, but noise of +-30 %: nothing shown, and nothing as large as 1.5 % ruled out
    noisy_b = [70.0, 130.0, 100.0, 85.0, 115.0, 95.0, 120.0, 80.0, 110.0, 90.0]
    noisy_h = [125.0, 75.0, 105.0, 88.0, 112.0, 97.0, 118.0, 83.0, 108.0, 93.0]
    d = _decide(noisy_b, noisy_h)
    assert d.status == "inconclusive" and d.unseen > 0.015 and inconclusive([d]) and not regressed([d])
    assert verdict_word([d]) == "INCONCLUSIVE"
    assert message([d]).startswith("INCONCLUSIVE") and f"{d.unseen:.1%}" in message([d])


def test_each_look_the_gate_may_take_is_a_test():
    assert looks(10, None) == 1 and looks(10, 10) == 1 and looks(10, 16) == 1 + 6 // BLOCK and looks(10, 11) == 2
    assert count_tests(1, {"output_throughput": 0.015}, looks=4) == 4
    _, alpha_one = decide(_gate_runs([1.0] * 5), _gate_runs([1.0] * 5), {"output_throughput": 0.015})
    _, alpha_four = decide(_gate_runs([1.0] * 5), _gate_runs([1.0] * 5), {"output_throughput": 0.015}, looks=4)
    assert alpha_four == pytest.approx(alpha_one / 4)


def test_gate_options_refuse_a_budget_below_the_repeats_and_an_unknown_inconclusive_action():
    with pytest.raises(ValueError, match="max-repeats: 4 is below --repeats 5"):
        GateOptions(base="main", repeats=5, max_repeats=4)
    with pytest.raises(ValueError, match="on-inconclusive must be one of fail, pass"):
        GateOptions(base="main", on_inconclusive="maybe")


# --- perf's order ---


def test_a_plans_configurations_run_interleaved_forward_then_backward():
    assert interleaved(["A", "B", "C"], 3) == [
        (0, "A"), (0, "B"), (0, "C"), (1, "C"), (1, "B"), (1, "A"), (2, "A"), (2, "B"), (2, "C")
    ]  # fmt: skip
    assert [c for _, c in interleaved(["base", "head"], 4)] == [
        "base",
        "head",
        "head",
        "base",
        "base",
        "head",
        "head",
        "base",
    ]  # fmt: skip  (the gate's ABBA)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        interleaved(["A"], 0)


def test_a_linear_drift_moves_every_configuration_alike_over_each_pair_of_repeats():
    configs = ["continuous", "static", "hf-static", "hf-cb"]
    order = interleaved(configs, 4)
    mean_position = {c: sum(i for i, (_, x) in enumerate(order) if x == c) / 4 for c in configs}
    assert len(set(mean_position.values())) == 1


# --- every ratio printed with its interval ---


def _entries(repeats: int, cont: float = 1.5, peer: float = 0.5) -> list:
    rng = random.Random(14)
    out = []
    for rep in range(repeats):
        for eng, mode, level in (
            ("refengine", "continuous", cont),
            ("refengine", "static", 1.0),
            ("hf-static", "static", peer),
        ):
            row = {"output_throughput": 100.0 * level * math.exp(rng.gauss(0, NOISE)), "device": "cpu", "repeat": rep}
            out.append(((eng, mode, "-"), row, None))
    return out


def test_the_table_and_its_notes_give_every_ratio_its_interval():
    cols = {c.header: c.cells for c in table_columns(_entries(5))}
    cont, static, peer = (str(x) for x in cols["÷ static"])
    assert cont.startswith("1.5") and "-" in cont and "within noise" not in cont
    assert static == "1.00x" and peer == ""
    assert "-" in str(cols["cont ÷ this"][2]) and str(cols["cont ÷ this"][2]).startswith("3.")
    lines = summary_lines(_entries(5))
    assert any(line.startswith("continuous / static output throughput: 1.5") and "-" in line for line in lines)
    assert any(line.startswith("refengine continuous / hf-static: 3.") for line in lines)
    assert NO_INTERVAL not in lines and RATIO_LEGEND in lines
    same = summary_lines(_entries(5, cont=1.0))
    assert any("continuous / static" in line and "within noise" in line for line in same)
    assert str(table_columns(_entries(5, cont=1.0))[-2].cells[0]).endswith(" noise")


def test_one_run_prints_its_ratio_without_an_interval_and_says_why():
    cols = {c.header: c.cells for c in table_columns(_entries(1))}
    assert str(cols["÷ static"][0]).endswith("x (1 run)")
    lines = summary_lines(_entries(1))
    assert any(line.startswith("continuous / static") and "(1 run each: no interval)" in line for line in lines)
    assert NO_INTERVAL in lines and RATIO_LEGEND not in lines


def test_the_json_and_the_markdown_carry_the_intervals():
    out = io.StringIO()
    render(Console(file=out, width=200), _entries(5), None, "json")
    runs = json.loads(out.getvalue())["runs"]
    cont = next(r for r in runs if r["batching"] == "continuous")
    v = cont["vs_static"]
    assert v["low"] < v["ratio"] < v["high"] and v["runs"] == [5, 5] and v["within_noise"] is False
    peer = next(r for r in runs if r["engine"] == "hf-static")
    assert peer["continuous_vs_this"]["low"] > 1 and peer["vs_static"] is None
    one = io.StringIO()
    render(Console(file=one, width=200), _entries(1), None, "json")
    single = next(r for r in json.loads(one.getvalue())["runs"] if r["batching"] == "continuous")["vs_static"]
    assert single["low"] is None and single["high"] is None and single["text"].endswith("no interval)")
    md = io.StringIO()
    render(Console(file=md, width=200), _entries(5), None, "markdown")
    assert "continuous / static output throughput: 1.5" in md.getvalue()


# --- compare's test path ---

ONLY_THROUGHPUT = {"*": None, "output_throughput": 0.05}  # one test: 3 repeats a side reach 95 %


def _compare(tmp_path, base_tps: list[float], new_tps: list[float], tol=ONLY_THROUGHPUT, **kw):
    from test_gate import csv, row

    from cbbench.perf.results.compare import compare

    b = csv(tmp_path, "b.csv", [row(repeat=i, tp=v) for i, v in enumerate(base_tps)])
    n = csv(tmp_path, "n.csv", [row(repeat=i, tp=v) for i, v in enumerate(new_tps)])
    rows, bad = compare(b, n, tol, **kw)
    (r,) = [r for r in rows if r["metric"] == "output_throughput"]
    return r, bad, rows


BASE_TPS = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2]


def test_compare_with_repeats_uses_the_u_test(tmp_path):
    r, bad, _ = _compare(tmp_path, BASE_TPS, [v * 0.9 for v in reversed(BASE_TPS)])
    assert bad and r["status"] == "regressed" and r["test"] == "U test" and r["high"] < 1
    # one repeat of the new side better than every baseline one: the tolerance rule would call this "noise";
    # five of six pairs the wrong way round are a significant, real slowdown to the test
    r, bad, _ = _compare(tmp_path, BASE_TPS, [80.0, 82.0, 81.0, 79.0, 83.0, 102.0])
    assert bad and r["status"] == "regressed"
    r, bad, _ = _compare(tmp_path, BASE_TPS, [v * 1.002 for v in BASE_TPS])
    assert not bad and r["status"] == "ok" and r["low"] > 0.95


def test_compare_says_inconclusive_with_the_smallest_change_it_could_see(tmp_path, capsys):
    from test_gate import csv, row

    from cbbench.perf.results.compare import EXIT_INCONCLUSIVE, main_compare

    noisy = [70.0, 130.0, 100.0, 85.0, 115.0, 95.0]
    r, bad, rows = _compare(tmp_path, noisy, list(reversed(noisy)))
    assert not bad and r["status"] == "inconclusive" and r["unseen"] > 0.05
    b = csv(tmp_path, "b2.csv", [row(repeat=i, tp=v) for i, v in enumerate(noisy)])
    n = csv(tmp_path, "n2.csv", [row(repeat=i, tp=v) for i, v in enumerate(reversed(noisy))])
    out = io.StringIO()
    tol = {"*": None, "output_throughput": 0.05}
    code = main_compare(b, n, tol, console=Console(file=out, width=300), use_tolerance_files=False)
    assert code == EXIT_INCONCLUSIVE and "INCONCLUSIVE" in out.getvalue() and f"{r['unseen']:.1%}" in out.getvalue()
    assert "decided by the U test" in out.getvalue()
    code = main_compare(
        b, n, tol, console=Console(file=io.StringIO()), on_inconclusive="pass", use_tolerance_files=False
    )
    assert code == 0


def test_compare_without_repeats_falls_back_to_tolerances_and_says_so(tmp_path):
    from test_gate import csv, row

    from cbbench.perf.results.compare import main_compare

    r, bad, rows = _compare(tmp_path, [100.0], [80.0])
    assert bad and r["status"] == "regressed" and r["test"] == "tolerance" and "low" not in r
    b = csv(tmp_path, "b3.csv", [row(tp=100.0)])
    n = csv(tmp_path, "n3.csv", [row(tp=99.0)])
    out = io.StringIO()
    assert main_compare(b, n, ONLY_THROUGHPUT, console=Console(file=out, width=300), use_tolerance_files=False) == 0
    assert "too few repeats for the U test" in out.getvalue() and "it needs 3 a side" in out.getvalue()


def test_the_series_benchmark_counts_intervals_that_hold_the_others_and_ones_across_1():
    from benchmarks.ratio_series import agreement

    assert agreement([(1.0, 0.9, 1.1), (1.05, 0.95, 1.15), (0.98, 0.9, 1.2)]) == (3, 0)
    # the second run's interval misses the first's estimate, and lies wholly above 1 while the first's is below
    assert agreement([(0.95, 0.9, 1.2), (1.3, 1.2, 1.4)]) == (0, 1)


def _fake_runs(monkeypatch, values: dict[str, list[float]]) -> list[tuple[str, int]]:
    """Make the gate's runs return the next of `values[arm]` as output throughput; returns the order they ran in."""
    from pathlib import Path

    import cbbench.perf.gate.run as gate_run
    from cbbench.perf.gate.arms import Run

    ran: list[tuple[str, int]] = []

    def run_once(arm, index, perf_args, folder, read, limit=None):
        ran.append((arm.name, index))
        row = {"engine": "refengine", "batching": "continuous", "output_throughput": values[arm.name][index]}
        return Run(arm.name, index, Path("x.csv"), [row], 1.0, 1.0)

    monkeypatch.setattr(gate_run, "run_once", run_once)
    monkeypatch.setattr(gate_run, "_check_sound", lambda arm, run: None)  # (no files behind these runs)
    return ran


class _NoOutputs:
    """The gate's reserved outputs, for runs that have no files: every write goes nowhere."""

    def write(self, *args, **kwargs) -> None:
        pass


def _measure(o, effects):
    from pathlib import Path

    import cbbench.perf.gate.run as gate_run
    from cbbench.perf.gate.arms import BASE, HEAD, Arm

    arms = {name: Arm(name, name, Path("."), {}) for name in (BASE, HEAD)}
    err = Console(file=io.StringIO())
    runs: list = []
    decisions, alpha = gate_run._measure_and_decide(
        o, arms, [], Path("."), err, effects, looks(o.repeats, o.max_repeats), runs, _NoOutputs()
    )
    return runs, decisions, alpha


def test_an_inconclusive_gate_adds_abba_blocks_up_to_its_budget(monkeypatch):
    effects = {"output_throughput": 0.05}
    noisy = [100.0, 70.0, 130.0, 95.0, 110.0, 80.0, 120.0, 90.0, 105.0, 85.0, 115.0, 100.0]
    ran = _fake_runs(monkeypatch, {"base": noisy, "head": list(reversed(noisy))})
    o = GateOptions(base="main", repeats=4, max_repeats=8, quiet=True)
    runs, decisions, _ = _measure(o, effects)
    assert [d.status for d in decisions] == ["inconclusive"]  # still, after the budget
    assert len(runs) == 16 and ran[8:] == [("base", 4), ("head", 4), ("head", 5), ("base", 5)] + [
        ("base", 6),
        ("head", 6),
        ("head", 7),
        ("base", 7),
    ]  # fmt: skip  (two ABBA blocks, indices going on)


def test_a_gate_stops_adding_runs_once_it_can_answer(monkeypatch):
    effects = {"output_throughput": 0.05}
    steady = [100.0 + 0.01 * i for i in range(12)]
    ran = _fake_runs(monkeypatch, {"base": steady, "head": [v * 0.7 for v in steady]})
    runs, decisions, _ = _measure(GateOptions(base="main", repeats=5, max_repeats=11, quiet=True), effects)
    assert [d.status for d in decisions] == ["regressed"] and len(ran) == 10  # no run added to a clear answer
