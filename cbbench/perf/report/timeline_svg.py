"""The HTML report's slot timeline: inline SVG, one rectangle per stretch of a request in a slot, coloured by the
same rule as its legend (`cell_fill`), with the request id and what it was doing on hover (an SVG `<title>`). A run past a few thousand requests (or
stretches) is drawn aggregated instead: stacked bars of the mean slots per kind over bins of steps, a bounded number
of rectangles whatever the run's length.

Each run's heading gives the slot use the results table gives (the row's `mean_slot_utilisation`), so the page
has one slot-use figure, not two that disagree.
"""

from __future__ import annotations

import html
import math
import zlib
from collections.abc import Sequence

from cbbench.perf.report.table import ReportRun, TableRow, percent
from cbbench.perf.report.table_title import cell_number
from cbbench.perf.report.timeline import Cell, StepView, assign_slots

# kind -> (how much of the request's colour shows, legend text); "held" is drawn in HELD_GREY whatever the request
KINDS = {
    "prefill": (1.0, "prefill"),
    "decode": (0.6, "decode"),
    "idle": (0.25, "admitted, not scheduled"),
    "held": (0.0, "slot held by a finished static request"),
}
HELD_GREY = 0.82
LEGEND_BASE = (0.3, 0.3, 0.3)  # the legend shows each shading on a neutral grey, as `cbbench timeline` does
STEP_PX, SLOT_PX, MAX_WIDTH_PX = 6, 14, 1200  # a step's width shrinks so long runs fit MAX_WIDTH_PX
# Past these a run is drawn aggregated (`aggregate_svg`): a rectangle per request stretch would make the page tens of
# megabytes (a simulated ShareGPT run of 1000 requests has some 200k stretches) and no one can hover them apart.
AGGREGATE_ABOVE_REQUESTS = 2000
MAX_STRETCHES = 4000
BIN_PX = 3  # an aggregated run: one column of stacked bars per BIN_PX pixels, so at most MAX_WIDTH_PX / BIN_PX bins


def palette() -> list[tuple[float, float, float]]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]  # a table of cmap.N = 20 colours: cmap(i) is the i-th, as RGBA
    return [(float(r), float(g), float(b)) for r, g, b, _ in (cmap(i) for i in range(cmap.N))]


def request_rgb(request_id: str, colours: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    n = int(request_id) if request_id.isdigit() else zlib.crc32(request_id.encode())
    return colours[n % len(colours)]


def cell_fill(rgb: Sequence[float], kind: str) -> str:
    """The `#rrggbb` a cell of this kind is drawn in: the colour mixed with white by the kind's strength."""
    mixed: tuple[float, ...]
    if kind == "held":
        mixed = (HELD_GREY,) * 3
    else:
        strength = KINDS[kind][0]
        mixed = tuple(1 - strength * (1 - c) for c in rgb)
    return "#" + "".join(f"{round(255 * c):02x}" for c in mixed)


def _stretches(cells: Sequence[Cell]) -> list[tuple[int, int, int, str, str]]:
    """(slot, first step, last step + 1, request id, kind): consecutive steps of one request and kind merged."""
    out: list[tuple[int, int, int, str, str]] = []
    last: dict[int, int] = {}  # slot -> the index in `out` of its last stretch
    for c in sorted(cells, key=lambda c: (c.slot, c.step)):
        i = last.get(c.slot)
        if i is not None and out[i][2] == c.step and out[i][3] == c.request_id and out[i][4] == c.kind:
            slot, first, end, rid, kind = out[i]
            out[i] = (slot, first, end + 1, rid, kind)
        else:
            last[c.slot] = len(out)
            out.append((c.slot, c.step, c.step + 1, c.request_id, c.kind))
    return out


def run_svg(run: ReportRun, max_num_seqs: int, colours: Sequence[tuple[float, float, float]]) -> str:
    """One run's timeline: slots down, engine steps across. No more slots can be used than there are requests, so a
    huge max_num_seqs (1e12 in a hand-edited JSON) draws only those."""
    views = [StepView.of(s) for s in run["steps"]]
    ids = {rid for v in views for rid in (*v.scheduled, *v.running)}
    max_num_seqs = min(max_num_seqs, max(len(ids), 1))
    cells = assign_slots(views, max_num_seqs)
    steps = len(run["steps"])
    seqs = max([max_num_seqs, *(c.slot + 1 for c in cells)])
    stretches = _stretches(cells)
    if len(ids) > AGGREGATE_ABOVE_REQUESTS or len(stretches) > MAX_STRETCHES:
        return aggregate_svg(cells, steps, seqs)
    dx = min(STEP_PX, MAX_WIDTH_PX / max(steps, 1))
    rects = []
    for slot, a, b, rid, kind in stretches:
        what = f"request {rid}: {KINDS[kind][1]}, steps {a}-{b - 1}, slot {slot}"
        rects.append(
            f'<rect x="{a * dx:.2f}" y="{slot * SLOT_PX}" width="{(b - a) * dx:.2f}" height="{SLOT_PX - 1}"'
            f' fill="{cell_fill(request_rgb(rid, colours), kind)}" data-request="{html.escape(rid)}"'
            f' data-kind="{kind}"><title>{html.escape(what)}</title></rect>'
        )
    width, height = max(steps * dx, 1), seqs * SLOT_PX
    return (
        f'<svg class="timeline-svg" width="{width:.0f}" height="{height}" viewBox="0 0 {width:.2f} {height}">'
        f"{''.join(rects)}</svg>"
    )


def aggregate_svg(cells: Sequence[Cell], steps: int, seqs: int) -> str:
    """A long run's timeline: the steps cut into at most MAX_WIDTH_PX / BIN_PX bins, each a stack of the mean number
    of slots per kind over its steps (prefill at the bottom, then decode, idle, held), in the legend's shadings. Its
    size is bounded whatever the run's length: at most four rectangles per bin."""
    bins = max(1, min(steps, MAX_WIDTH_PX // BIN_PX))
    # Bin b holds the steps s with s * bins // steps == b: from starts[b] = ceil(b * steps / bins) to starts[b + 1] - 1,
    # never empty (steps >= bins). The one rule places each cell, names the bin's steps and divides its counts, so a
    # bin's mean is over exactly the steps it counted.
    starts = [-(-b * steps // bins) for b in range(bins + 1)]
    counts = {kind: [0] * bins for kind in KINDS}
    for c in cells:
        counts[c.kind][c.step * bins // steps] += 1
    width, height = bins * BIN_PX, seqs * SLOT_PX
    rects = []
    for b in range(bins):
        first, last = starts[b], starts[b + 1] - 1
        n = last - first + 1
        y = float(height)
        for kind in KINDS:
            mean = counts[kind][b] / n
            if mean <= 0:
                continue
            h = mean * SLOT_PX
            y -= h
            rects.append(
                f'<rect x="{b * BIN_PX}" y="{y:.2f}" width="{BIN_PX}" height="{h:.2f}"'
                f' fill="{cell_fill(LEGEND_BASE, kind)}" data-kind="{kind}"><title>steps {first}-{last}:'
                f" {mean:.1f} slots {KINDS[kind][1]}</title></rect>"
            )
    return (
        f'<svg class="timeline-svg aggregated" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"{''.join(rects)}</svg>"
    )


def slot_use(row: TableRow | None) -> str:
    """The table's slot-use figure for this run ('' when the row has none)."""
    v = cell_number((row or {}).get("mean_slot_utilisation"))  # None, a number, or a CSV's text
    return f"slot util {percent(v)}" if math.isfinite(v) else ""


def legend_html() -> str:
    items = "".join(
        f'<span class="swatch" data-kind="{kind}" style="background:{cell_fill(LEGEND_BASE, kind)}">'
        f"</span>{html.escape(text)}"
        for kind, (_, text) in KINDS.items()
    )
    return f'<p class="legend" id="timeline-legend">{items}; each request has its own colour, its id on hover</p>'


def timeline_html(runs: Sequence[ReportRun]) -> str | None:
    """Every refengine run's first repeat whose steps carry request ids, with the legend; None if there is none."""
    drawn = [
        (r, row)
        for r in runs
        if r["repeat"] == 0
        and r["steps"]
        and "scheduled_req_ids" in r["steps"][0]
        and (row := r["row"])
        and _int(row.get("max_num_seqs")) >= 1
    ]
    if not drawn:
        return None
    colours = palette()
    parts = [legend_html()]
    for r, row in drawn:
        name = " ".join(x for x in r["key"] if x != "-")
        svg = run_svg(r, _int(row["max_num_seqs"]), colours)
        aggregated = "slots per kind, mean over bins of steps" if "aggregated" in svg[:40] else ""
        heading = ", ".join(x for x in (f"{len(r['steps'])} steps", slot_use(row), aggregated) if x)
        parts.append(
            f'<figure class="run-timeline"><figcaption>{html.escape(name)}: {heading}</figcaption>{svg}</figure>'
        )
    return "".join(parts)


def _int(v: object) -> int:
    f = cell_number(v)
    return 0 if math.isnan(f) else int(f)  # (inf: OverflowError, as int(float("inf")) raises)
