"""The report's Python-drawn charts against the numbers they are drawn from: every point read back from the SVG text
(through the axis it is drawn against) is its run's or its scrape's value.

- The capacity plan's frontier chart (`frontier_svg`): one circle per run at (TPOT p99, output tok/s per GPU), green
  where the run meets the SLO; the frontier's line through exactly the Pareto set, in order of latency; the SLO's
  dashed line at its bound; the ring on the best configuration per GPU.
- An HTTP run's /metrics chart (`run_chart`): each scrape at (its time, its value), the counts against the left axis
  (0 to the largest count), KV usage in percent against the right one (0 to 100).
The slot timeline has its own file (test_timeline_geometry.py).
"""

from __future__ import annotations

import re

import pytest

from cbbench.perf.report.frontier_svg import BOTTOM, HEIGHT, LEFT, RIGHT, TOP, WIDTH, frontier_svg
from cbbench.perf.report.server_series import HEIGHT as SERIES_HEIGHT
from cbbench.perf.report.server_series import LINES, PAD, run_chart
from cbbench.perf.report.server_series import WIDTH as SERIES_WIDTH
from cbbench.perf.results.frontier import Candidate, Slo, best_per_gpu, pareto

# the charts write coordinates with one decimal: a point is within 0.05 px of where its value puts it
COORD_TOLERANCE_PX = 0.051

_ATTRS = re.compile(r'([\w-]+)="([^"]*)"')


def _elements(svg: str, tag: str) -> list[dict[str, str]]:
    return [dict(_ATTRS.findall(attrs)) for attrs in re.findall(rf"<{tag} ([^>]*?)/?>", svg)]


def _points(attr: str) -> list[float]:
    """An SVG `points` attribute, "x,y x,y ...", as [x, y, x, y, ...]."""
    return [float(v) for p in attr.split() for v in p.split(",")]


def _flat(points: list[tuple[float, float]]) -> list[float]:
    return [v for p in points for v in p]


def _candidate(name: str, tok_s: float, gpus: int, tpot: float, meets: bool) -> Candidate:
    return Candidate({}, name, gpus, tok_s, 100.0, tpot, () if meets else ("TPOT p99 over",))


RUNS = [
    _candidate("a", 900.0, 1, 12.0, True),
    _candidate("b", 1500.0, 2, 8.0, True),  # 750 per GPU, the lowest TPOT
    _candidate("c", 1300.0, 1, 30.0, False),
    _candidate("d", 400.0, 1, 20.0, True),  # dominated by a (more per GPU and a lower TPOT)
    _candidate("e", 2800.0, 2, 45.0, False),
]


def test_the_frontier_chart_puts_each_run_at_its_latency_and_throughput_per_gpu():
    slo = Slo(tpot_p99_ms=25.0)
    svg = frontier_svg(RUNS, slo)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    texts = re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg)
    x_ticks = {float(label): float(x) for x, y, label in texts if float(y) == TOP + h + 16}
    y_ticks = {float(label): float(y) - 4 for x, y, label in texts if float(x) == LEFT - 6}
    x_max, y_max = max(x_ticks), max(y_ticks)
    assert x_max >= max(c.tpot_p99_ms for c in RUNS + [_candidate("slo", 0, 1, 25.0, True)])
    assert y_max >= max(c.per_gpu for c in RUNS)
    # the tick labels sit where their values put them: the axes are linear from 0 at the plot area's corner
    for v, px in x_ticks.items():
        assert px == pytest.approx(LEFT + w * v / x_max, abs=COORD_TOLERANCE_PX)
    for v, px in y_ticks.items():
        assert px == pytest.approx(TOP + h * (1 - v / y_max), abs=COORD_TOLERANCE_PX)

    def at(c: Candidate) -> tuple[float, float]:
        return LEFT + w * c.tpot_p99_ms / x_max, TOP + h * (1 - c.per_gpu / y_max)

    circles = [e for e in _elements(svg, "circle") if e["class"].startswith("run ")]
    assert len(circles) == len(RUNS)
    for c, e in zip(RUNS, circles):
        cx, cy = at(c)
        assert (float(e["cx"]), float(e["cy"])) == pytest.approx((cx, cy), abs=COORD_TOLERANCE_PX), c.config
        assert e["class"] == ("run meets" if c.meets_slo else "run misses"), c.config
        assert LEFT <= float(e["cx"]) <= LEFT + w and TOP <= float(e["cy"]) <= TOP + h
    (line,) = [e for e in _elements(svg, "polyline") if e["class"] == "frontier"]
    front = sorted(pareto(RUNS), key=lambda c: c.tpot_p99_ms)
    assert [c.config for c in front] == ["b", "a", "c", "e"]  # d is dominated (a: more per GPU, lower TPOT)
    assert _points(line["points"]) == pytest.approx(_flat([at(c) for c in front]), abs=COORD_TOLERANCE_PX)
    (slo_line,) = [e for e in _elements(svg, "line") if e.get("class") == "slo"]
    assert float(slo_line["x1"]) == float(slo_line["x2"]) == pytest.approx(LEFT + w * 25.0 / x_max, abs=0.051)
    (ring,) = [e for e in _elements(svg, "circle") if e["class"] == "best"]
    best = best_per_gpu(RUNS)
    assert best is not None and best.config == "a"  # the most per GPU among those meeting the SLO
    assert (float(ring["cx"]), float(ring["cy"])) == pytest.approx(at(best), abs=COORD_TOLERANCE_PX)


def test_the_metrics_chart_puts_each_scrape_at_its_time_and_value():
    scrapes = [
        {"time": 0.0, "kv_usage": 0.10, "num_running": 2.0, "num_waiting": 0.0, "num_preemptions": 0.0},
        {"time": 1.5, "kv_usage": 0.85, "num_running": 6.0, "num_waiting": 9.0, "num_preemptions": 1.0},
        {"time": 4.0, "kv_usage": 0.40, "num_running": 3.0, "num_waiting": 1.0, "num_preemptions": 3.0},
    ]
    svg = run_chart("openai/-/-/repeat0", scrapes)
    t_max, left_max = 4.0, 9.0  # the last scrape, the largest count
    assert f"({t_max:.1f} s)" in svg and f">{left_max:g}</text>" in svg

    def x(t: float) -> float:
        return PAD + (SERIES_WIDTH - 2 * PAD) * t / t_max

    def y(v: float, top: float) -> float:
        return SERIES_HEIGHT - PAD + (PAD / 2 - (SERIES_HEIGHT - PAD)) * v / top

    lines = {e["data-series"]: e for e in _elements(svg, "polyline")}
    assert set(lines) == set(LINES)
    for key, e in lines.items():
        if LINES[key][2] == "right":  # KV usage: a fraction, drawn in percent on the 0-100 axis
            want = [(x(s["time"]), y(100 * s[key], 100.0)) for s in scrapes]
        else:
            want = [(x(s["time"]), y(s[key], left_max)) for s in scrapes]
        assert _points(e["points"]) == pytest.approx(_flat(want), abs=COORD_TOLERANCE_PX), key
