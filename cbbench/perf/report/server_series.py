"""The HTML report's chart of an HTTP run's scraped /metrics: KV usage, running, waiting and preemptions over time.

The run's document (the record folder's run files, or an older JSON) keeps, per HTTP run, the points `ServerMetrics`
scraped (`server_metrics`: a list of `SERIES_KEYS` dicts). Each run with at least one point gets one inline SVG: the three counts against the left axis,
KV usage (0-100 %) against the right one, a legend with each line's peak, and the values on hover. A JSON without
a series (an in-process run, a server without /metrics) gets no chart at all, not an empty one.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence

# series key (server_metrics.SERIES_KEYS, less "time"; not imported: that module needs aiohttp) -> (legend text,
# colour, axis): KV usage is a fraction, drawn in % on its own (right) axis
LINES = {
    "kv_usage": ("KV usage %", "#d62728", "right"),
    "num_running": ("running", "#1f77b4", "left"),
    "num_waiting": ("waiting", "#ff7f0e", "left"),
    "num_preemptions": ("preemptions (since start)", "#2ca02c", "left"),
}
WIDTH, HEIGHT, PAD = 720, 220, 44  # px; PAD leaves room for the axis labels


def _value(point: Mapping[str, object], key: str) -> float | None:
    v = point.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return float(v) * 100 if key == "kv_usage" else float(v)


def _points(series: Sequence[object], key: str) -> list[tuple[float, float]]:
    """(time, value) of each point of a JSON series that has both (a point that is not an object has neither)."""
    return [
        (t, v)
        for p in series
        if isinstance(p, Mapping) and (v := _value(p, key)) is not None and (t := _value(p, "time")) is not None
    ]


def _scale(lo: float, hi: float, a: float, b: float) -> Callable[[float], float]:
    return lambda v: a + (b - a) * ((v - lo) / (hi - lo) if hi > lo else 0.5)


def run_chart(label: str, series: Sequence[object]) -> str:
    """One run's SVG ('' when no line has a point)."""
    lines = {k: pts for k in LINES if (pts := _points(series, k))}
    if not lines:
        return ""
    t_max = max(t for pts in lines.values() for t, _ in pts) or 1.0
    left_max = max([v for k, pts in lines.items() if LINES[k][2] == "left" for _, v in pts] + [1.0])
    x = _scale(0.0, t_max, PAD, WIDTH - PAD)
    y = {"left": _scale(0.0, left_max, HEIGHT - PAD, PAD / 2), "right": _scale(0.0, 100.0, HEIGHT - PAD, PAD / 2)}
    parts = [
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>',
        f'<text x="{WIDTH / 2}" y="{HEIGHT - 8}" text-anchor="middle" font-size="11">seconds since the run began'
        f" ({t_max:.1f} s)</text>",
        f'<text x="4" y="{PAD / 2 + 4}" font-size="11">{left_max:g}</text>',
        f'<text x="{WIDTH - PAD + 4}" y="{PAD / 2 + 4}" font-size="11">100 %</text>',
    ]
    for key, pts in lines.items():
        name, colour, axis = LINES[key]
        coords = " ".join(f"{x(t):.1f},{y[axis](v):.1f}" for t, v in pts)
        tip = html.escape(f"{name}: peak {max(v for _, v in pts):g} ({len(pts)} scrapes)")
        parts.append(
            f'<polyline data-series="{key}" fill="none" stroke="{colour}" stroke-width="1.5" points="{coords}">'
            f"<title>{tip}</title></polyline>"
        )
    legend = "".join(
        f'<span style="color:{LINES[k][1]}">&#9632; {html.escape(LINES[k][0])} (peak {max(v for _, v in pts):g})'
        "</span> "
        for k, pts in lines.items()
    )
    return (
        f'<figure class="server-metrics"><figcaption>{html.escape(label)}: {legend}</figcaption>'
        f'<svg width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="server /metrics over time">'
        + "".join(parts)
        + "</svg></figure>"
    )


def server_metrics_html(doc: Mapping[str, object]) -> str:
    """The report's section of /metrics charts, one per HTTP run with a series ('' when the JSON has none)."""
    runs = doc.get("server_metrics")
    if not isinstance(runs, Mapping):
        return ""
    charts = [run_chart(str(label), s) for label, s in runs.items() if isinstance(s, list)]
    charts = [c for c in charts if c]
    if not charts:
        return ""
    keys = ", ".join(LINES)
    return (
        '<section id="server-metrics"><h2>Server /metrics over time</h2>'
        f'<p class="sub">Scraped during each HTTP run ({html.escape(keys)}); KV usage on the right axis.</p>'
        + "".join(charts)
        + "</section>"
    )
