"""The value-axis rule that `cbbench report`'s CDFs and `cbbench plot` share (perf/report/axis_scale.py): a log axis
where the plotted values spread over more than two decades, linear otherwise. Checked on the rule itself (the scale
and range chosen for a given spread), on the report's chart data (every mode's curve spans a visible share of its
axis), and on the latencies of the README's simulated run (fixtures/readme-sim-latencies.json), where `none`'s TTFT
reaches a million ms and, on a linear axis, every other mode's median sat in the first 2% of it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cbbench.perf.report.axis_scale import LOG_SPREAD, Axis, choose_axis
from cbbench.perf.report.html import cdf_data

FIXTURE = Path(__file__).parent / "fixtures" / "readme-sim-latencies.json"
# a curve is visible when it spans at least a tenth of the axis (60 px of the report's 600 px chart) ...
VISIBLE_SHARE = 0.1
# ... and a mode is not "in the first pixels" when its median sits at least a tenth of the way along the axis
MEDIAN_CLEAR_OF_EDGE = 0.1


def _share(axis: Axis, xs: list[float]) -> float:
    return axis.position(max(xs)) - axis.position(min(xs))


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


@pytest.mark.parametrize(
    ("values", "scale"),
    [
        ([1.0, 100.0], "linear"),  # exactly two decades: still linear
        ([1.0, 100.5], "log"),
        ([0.0, 0.5, 40.0], "linear"),  # zero has no decade: the spread is of the positive values
        ([0.0, 0.5, 60.0], "log"),
        ([180.0, 11450.0, 1_000_300.0], "log"),
        ([5.2, 18.0, 30.0], "linear"),
        ([math.nan, math.inf, 3.0, 7.0], "linear"),
        ([], "linear"),
    ],
)
def test_the_scale_follows_the_spread(values, scale):
    axis = choose_axis(values)
    assert axis.scale == scale
    finite = [v for v in values if math.isfinite(v)]
    assert all(axis.lo <= v <= axis.hi for v in finite if scale == "linear" or v > 0)  # every value inside
    assert axis.lo < axis.hi and all(axis.lo <= t <= axis.hi for t in axis.ticks) and len(axis.ticks) >= 2


def test_a_log_axis_has_round_ends_and_a_label_per_decade():
    axis = choose_axis([5.36, 180.0, 1_000_300.0])
    assert (axis.scale, axis.lo, axis.hi) == ("log", 2.0, 2_000_000.0)  # 1, 2 or 5 times a power of ten, past the ends
    assert axis.ticks == (10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0)
    assert 5.0 in axis.minor and 1_000_000.0 not in axis.minor
    assert axis.position(axis.lo) == 0 and axis.position(axis.hi) == pytest.approx(1)
    assert axis.position(0.0) == 0 and axis.position(-3.0) == 0  # a zero gap is drawn at the low end, not dropped
    assert axis.position(1000.0) == pytest.approx(math.log10(500) / 6)


def test_a_linear_axis_starts_at_zero_and_ends_on_a_round_tick():
    axis = choose_axis([5.2, 18.0, 30.0])
    assert (axis.lo, axis.hi, axis.ticks) == (0.0, 30.0, (0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0))
    assert axis.position(15.0) == 0.5
    assert choose_axis([-2.0, 40.0]).lo == -10.0  # a negative value stays inside


def test_many_decades_keep_at_most_eight_labels():
    axis = choose_axis([0.001, 1e9])
    assert axis.scale == "log" and 2 <= len(axis.ticks) <= 8
    assert all(math.log10(t).is_integer() for t in axis.ticks)


def _run(mode: str, ttft_ms: list[float], gap_ms: list[float]) -> dict:
    """One measured run as html.runs_of gives it: requests arriving at 0, each with its TTFT and token gaps."""
    records = []
    for t in ttft_ms:
        times = [t / 1000]
        for g in gap_ms:
            times.append(times[-1] + g / 1000)
        records.append(
            {"arrival_time": 0.0, "first_token_time": t / 1000, "token_times": times, "finish_reason": "length"}
        )
    return {"key": ("refengine", mode, "-"), "repeat": 0, "records": records}


def _geometric(lo: float, hi: float, n: int = 20) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def test_the_report_draws_every_mode_where_it_can_be_seen():
    """The README run's shape: `none` serves one request at a time, so its TTFT runs to ~10^6 ms, three decades past
    the other modes; its token gaps are one step each, while `sequence`'s wait for other prefills."""
    runs = [
        _run("continuous", _geometric(180, 11_000), _geometric(5, 180, 8)),
        _run("static", _geometric(180, 28_000), _geometric(5, 180, 8)),
        _run("sequence", _geometric(180, 12_000), _geometric(5, 1000, 8)),
        _run("none", _geometric(5, 1_000_000), _geometric(5, 40, 8)),
    ]
    charts = cdf_data(runs)
    for name in ("ttft", "itl"):
        chart = charts[name]
        axis = Axis(**{k: tuple(v) if isinstance(v, list) else v for k, v in chart["axis"].items()})
        assert axis.scale == "log" and "log scale" in chart["xlabel"]
        linear = Axis("linear", 0.0, axis.hi, ())  # what the page drew before
        for s in chart["series"]:
            assert axis.lo <= min(s["x"]) and max(s["x"]) <= axis.hi
            assert _share(axis, s["x"]) >= VISIBLE_SHARE, (name, s["name"])
            assert axis.position(_median(s["x"])) >= MEDIAN_CLEAR_OF_EDGE, (name, s["name"])
        squeezed = [s["name"] for s in chart["series"] if _share(linear, s["x"]) < VISIBLE_SHARE]
        assert squeezed, "the data must be one a linear axis fails to show"


def test_a_narrow_spread_keeps_the_linear_axis():
    charts = cdf_data([_run("continuous", [20, 30, 45], [5, 6, 7]), _run("static", [25, 60, 90], [5, 9, 12])])
    for name in ("ttft", "itl"):
        assert charts[name]["axis"]["scale"] == "linear" and charts[name]["axis"]["lo"] == 0.0
        assert "log" not in charts[name]["xlabel"]
    assert charts["ttft"]["axis"]["hi"] >= 90 and charts["itl"]["axis"]["hi"] >= 7


@pytest.mark.parametrize("chart", ["ttft", "itl"])
def test_the_readme_runs_latencies_get_an_axis_that_shows_every_mode(chart):
    """Every mode's median clear of the axis's low end (on the linear axis to the slowest value, four or five of the
    five sat within its first 2%), and each TTFT curve spanning a visible share (on the linear one, under 6%)."""
    data = json.loads(FIXTURE.read_text())[chart]
    values = [x for xs in data.values() for x in xs]
    assert max(values) / min(values) > LOG_SPREAD
    axis = choose_axis(values)
    assert axis.scale == "log" and axis.lo <= min(values) and max(values) <= axis.hi
    for name, xs in data.items():
        assert axis.position(_median(xs)) >= MEDIAN_CLEAR_OF_EDGE, name
        if chart == "ttft":
            assert _share(axis, xs) >= VISIBLE_SHARE, name
    linear = Axis("linear", 0.0, max(values), ())
    assert sum(linear.position(_median(xs)) < MEDIAN_CLEAR_OF_EDGE for xs in data.values()) >= 4
