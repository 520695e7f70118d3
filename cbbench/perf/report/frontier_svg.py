"""The capacity plan's section of `cbbench report`: output tokens/s per GPU against TPOT p99, one point per run of
a `cbbench plan` grid, the Pareto frontier drawn through its points, the SLO's TPOT bound as a dashed line and the
best configuration per GPU ringed; then the same answer as text (`cbbench plan`'s summary, results/frontier.py).

Inline SVG written here from the rows (nothing fetched, no script needed); a run JSON that `cbbench plan` did not
write (no `capacity_plan` in its config) gets no section.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import cast

from cbbench.perf.results.frontier import Candidate, Slo, best_per_gpu, candidates, pareto, summary_lines

WIDTH, HEIGHT = 720, 380
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50  # the plot area's margins (room for the tick labels)
TICKS = 5
MEETS, MISSES, FRONT = "#1b7f3b", "#b0b0b0", "#1f5fbf"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _ticks(top: float) -> list[float]:
    """Round steps (1, 2 or 5 times a power of ten) from 0 to just past `top`, at most TICKS of them."""
    raw = top / TICKS if top > 0 else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    return [step * i for i in range(max(1, math.ceil(top / step)) + 1)]


def frontier_svg(cands: Sequence[Candidate], slo: Slo) -> str:
    """The scatter of `cands` with its frontier; '' when no run has both numbers."""
    pts = [c for c in cands if math.isfinite(c.per_gpu) and math.isfinite(c.tpot_p99_ms)]
    if not pts:
        return ""
    slo_x = slo.tpot_p99_ms
    xt = _ticks(max([c.tpot_p99_ms for c in pts] + [slo_x or 0.0]) * 1.05)
    yt = _ticks(max(c.per_gpu for c in pts) * 1.05)
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + w * v / xt[-1]

    def y(v: float) -> float:
        return TOP + h * (1 - v / yt[-1])

    out = [f'<svg id="frontier-svg" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">']
    for t in xt:
        out.append(f'<line x1="{x(t):.1f}" y1="{TOP}" x2="{x(t):.1f}" y2="{TOP + h}" stroke="#eee"/>')
        out.append(f'<text x="{x(t):.1f}" y="{TOP + h + 16}" text-anchor="middle" font-size="11">{t:g}</text>')
    for t in yt:
        out.append(f'<line x1="{LEFT}" y1="{y(t):.1f}" x2="{LEFT + w}" y2="{y(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(t) + 4:.1f}" text-anchor="end" font-size="11">{t:g}</text>')
    out.append(
        f'<text x="{LEFT + w / 2}" y="{HEIGHT - 10}" text-anchor="middle" font-size="12">TPOT p99 (ms)</text>'
        f'<text transform="translate(14 {TOP + h / 2}) rotate(-90)" text-anchor="middle" font-size="12">'
        "output tok/s per GPU</text>"
    )
    if slo_x is not None:
        out.append(
            f'<line class="slo" x1="{x(slo_x):.1f}" y1="{TOP}" x2="{x(slo_x):.1f}" y2="{TOP + h}" stroke="#c0392b" '
            f'stroke-dasharray="5 4"/><text x="{x(slo_x) + 4:.1f}" y="{TOP + 12}" font-size="11" fill="#c0392b">'
            f"SLO {slo_x:g} ms</text>"
        )
    front = pareto(pts)
    line = " ".join(f"{x(c.tpot_p99_ms):.1f},{y(c.per_gpu):.1f}" for c in front)
    out.append(f'<polyline class="frontier" points="{line}" fill="none" stroke="{FRONT}" stroke-width="1.5"/>')
    for c in pts:
        tip = f"{c.config}: {c.per_gpu:.1f} tok/s/GPU, TPOT p99 {c.tpot_p99_ms:.2f} ms, TTFT p99 {c.ttft_p99_ms:.1f} ms"
        out.append(
            f'<circle class="run {"meets" if c.meets_slo else "misses"}" cx="{x(c.tpot_p99_ms):.1f}" '
            f'cy="{y(c.per_gpu):.1f}" r="4" fill="{MEETS if c.meets_slo else MISSES}"><title>{_e(tip)}</title></circle>'
        )
    best = best_per_gpu(pts)
    if best is not None:
        out.append(
            f'<circle class="best" cx="{x(best.tpot_p99_ms):.1f}" cy="{y(best.per_gpu):.1f}" r="9" fill="none" '
            f'stroke="{MEETS}" stroke-width="2"/>'
        )
    out.append("</svg>")
    return "".join(out)


def frontier_html(doc: Mapping[str, object]) -> str:
    """The report's capacity-plan section, or '' for a run `cbbench plan` did not write."""
    config = doc.get("config") or {}
    cfg = config.get("capacity_plan") if isinstance(config, Mapping) else None
    if not isinstance(cfg, Mapping):
        return ""
    # (Slo checks the bounds it is given: a JSON's that are not numbers are refused there)
    slo = Slo(cast(float | None, cfg.get("slo_ttft_p99_ms")), cast(float | None, cfg.get("slo_tpot_p99_ms")))
    given = doc.get("rows") or []
    rows = [dict(r) for r in (given if isinstance(given, list) else []) if isinstance(r, Mapping)]
    svg = frontier_svg(candidates(rows, slo), slo)
    text = "\n".join(summary_lines(list(rows), slo))
    return (
        '<section id="frontier"><h2>Capacity plan: throughput per GPU against latency</h2>'
        '<p class="sub">One point per run (green: meets the SLO; grey: misses it); the line is the Pareto frontier, '
        f'the ring the best configuration per GPU.</p>{svg}<pre id="frontier-text">{_e(text)}</pre></section>'
    )
