"""`cbbench report RUN.json -o report.html`: one self-contained HTML page for a `cbbench perf` run.

The page holds the results table (the terminal table's columns, empty ones left out, ratios and notes), the TTFT
and ITL CDFs of every configuration (inline SVG drawn by inline JS from embedded data), the slot timeline of each
measured refengine run (inline SVG from the per-step request ids of the run's records, request ids on hover, the legend
drawn from the same colour rule), for a request-rate sweep `cbbench plot`'s latency-against-throughput panels (a
base64 PNG), for a `cbbench plan` grid its throughput-per-GPU frontier (frontier_svg.py), for HTTP runs the scraped /metrics series (server_series.py), the environment, and the
configuration as the engine resolved it. Nothing is fetched: no external
script, style sheet, font or image.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np

from cbbench.perf.json_values import JSONValue, as_list, as_object
from cbbench.perf.metrics import parse_goodput
from cbbench.perf.report.assets import CSS, JS
from cbbench.perf.report.axis_scale import choose_axis
from cbbench.perf.report.frontier_svg import frontier_html
from cbbench.perf.report.server_series import server_metrics_html
from cbbench.perf.report.table import Entry, ReportRun, fit_columns, summary_lines, table_columns
from cbbench.perf.report.table_title import cell_number, table_title
from cbbench.perf.report.timeline_svg import timeline_html
from cbbench.perf.results.columns import CONFIG_KEY_COLUMNS
from cbbench.perf.results.files import atomic_write_text, write_csv
from cbbench.perf.results.run_json import RunDocument, read_run

CDF_POINTS = 400  # each CDF is drawn through this many quantiles: exact enough to read, small enough to embed


def load_run(path: str | Path) -> RunDocument:
    """The run's document (run_json.py: a summary's records read from its record folder), checked."""

    doc = read_run(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list) or not isinstance(doc.get("records"), dict):
        raise ValueError(f"{path}: not a cbbench perf run JSON (no 'rows' list and 'records' by run)")
    bad_row = next((i for i, r in enumerate(doc["rows"]) if not isinstance(r, dict)), None)
    if bad_row is not None:
        raise ValueError(f"{path}: row {bad_row + 1} is not an object")
    for label, recs in doc["records"].items():
        if recs is not None and not (isinstance(recs, list) and all(isinstance(r, dict) for r in recs)):
            raise ValueError(f"{path}: the records of run {label!r} are not a list of objects")
    if doc.get("steps") is not None and not isinstance(doc["steps"], dict):
        raise ValueError(f"{path}: 'steps' is not an object by run")
    return doc


def runs_of(doc: RunDocument) -> list[ReportRun]:
    """One entry per measured run: its label parts, CSV row, request records and step dicts. `load_run` gives
    rows and records in the same order (a summary's paired by plan entry); a label reads engine/batching/knobs/repeatN."""
    labels = list(doc["records"])
    rows = doc["rows"]
    out: list[ReportRun] = []
    for i, label in enumerate(labels):
        head, _, rep = label.rpartition("/repeat")
        engine, batching, knobs = (head.split("/", 2) + ["-", "-"])[:3]
        row = (
            rows[i]
            if len(rows) == len(labels)
            else next(
                (
                    r
                    for r in rows
                    if r.get("engine") == engine and r.get("batching") == batching and str(r.get("repeat")) == rep
                ),
                None,
            )
        )
        out.append(
            {
                "label": label,
                "key": (engine, batching, knobs or "-"),
                "repeat": int(rep or 0),
                "row": row,
                "records": doc["records"][label] or [],
                "steps": (doc.get("steps") or {}).get(label) or [],
            }
        )
    return out


def _float(v: object) -> float:
    return cell_number(v)


def _cdf(values_ms: Sequence[float]) -> tuple[list[float], list[float]]:
    """(x, y) of the CDF of the finite values."""
    v = np.sort(np.asarray([x for x in values_ms if math.isfinite(x)], dtype=float))
    if len(v) == 0:
        return [], []
    if len(v) > CDF_POINTS:
        p = np.linspace(0, 1, CDF_POINTS)
        return np.quantile(v, p).round(3).tolist(), p.round(4).tolist()
    return v.round(3).tolist(), (np.arange(1, len(v) + 1) / len(v)).round(4).tolist()


def latency_values(records: Sequence[Mapping[str, JSONValue]]) -> tuple[list[float], list[float]]:
    """(TTFT per completed request, every inter-token gap), in ms, as cbbench.perf.metrics defines them."""
    ttft, itl = [], []
    for r in records:
        if r.get("finish_reason") in ("abort", "error"):
            continue
        ttft.append((_float(r.get("first_token_time")) - _float(r.get("arrival_time"))) * 1000)
        times = [_float(t) for t in as_list(r.get("token_times") or r.get("chunk_times") or [])]
        itl += [(b - a) * 1000 for a, b in zip(times, times[1:])]
    return ttft, itl


class Series(TypedDict):
    """One configuration's curve in a CDF chart."""

    name: str
    x: list[float]
    y: list[float]


class Chart(TypedDict, total=False):
    """One CDF chart as the page's script draws it: its curves and the x axis they share (`Axis.to_json()`)."""

    title: str
    xlabel: str
    unit: str
    series: list[Series]
    axis: dict[str, object]


def cdf_data(runs: Sequence[ReportRun]) -> dict[str, Chart]:
    """The embedded chart data: per configuration (its first repeat), the TTFT and ITL CDFs, and per chart the x
    axis they share (`Axis.to_json()`: log where the values spread over more than two decades)."""
    first = [r for r in runs if r["repeat"] == min(x["repeat"] for x in runs if x["key"] == r["key"])]
    ttft_series: list[Series] = []
    itl_series: list[Series] = []
    charts: dict[str, Chart] = {
        "ttft": {"title": "TTFT", "xlabel": "TTFT (ms)", "unit": "requests", "series": ttft_series},
        "itl": {"title": "ITL", "xlabel": "inter-token latency (ms)", "unit": "token gaps", "series": itl_series},
    }
    for r in first:
        name = " ".join(x for x in r["key"] if x != "-")
        ttft, itl = latency_values(r["records"])
        for series, values in ((ttft_series, ttft), (itl_series, itl)):
            x, y = _cdf(values)
            series.append({"name": name, "x": x, "y": y})
    for chart in charts.values():
        # one axis for every mode's curve, chosen by the rule `cbbench plot` uses too (axis_scale.py)
        axis = choose_axis(x for s in chart["series"] for x in s["x"])
        chart["axis"] = axis.to_json()
        if axis.scale == "log":
            chart["xlabel"] = chart["xlabel"].replace(" (ms)", " (ms, log scale)")
    return charts


def latency_throughput_png(rows: Sequence[Mapping[str, object]]) -> str | None:
    """Base64 PNG of `cbbench plot`'s latency-against-throughput panels when the rows sweep the request rate
    (drawn by the same code from the rows, through a scratch CSV); None for a run at one rate."""
    if len({str(r.get("request_rate")) for r in rows}) < 2:
        return None

    import matplotlib.pyplot as plt

    from cbbench.perf.report.plot import make_figure  # (brings in pandas)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rows.csv"
        write_csv(path, list(rows))
        fig, _ = make_figure([path], kind="latency")
    try:
        fig.suptitle("latency against output throughput, one point per request rate", fontsize=10)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
    finally:
        plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def results_table(entries: Sequence[Entry], goodput: Mapping[str, float] | None) -> str:
    cols, _, _ = fit_columns(table_columns(entries, goodput=goodput), None)
    head = "".join(f'<th class="{"key" if c.priority == -1 else "num"}">{_e(c.header)}</th>' for c in cols)
    body = []
    for row in zip(*(c.cells for c in cols)):
        tds = "".join(
            f'<td class="{"key" if c.priority == -1 else "num"}{" failed" if str(v) == "failed" else ""}">{_e(v)}</td>'
            for c, v in zip(cols, row)
        )
        body.append(f"<tr>{tds}</tr>")
    return f'<table id="results"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def resolved_config(runs: Sequence[ReportRun]) -> str:
    """One row per configuration (its first repeat): every config column that any of them sets, as the row
    records it (the knobs the engine resolved, not the options typed)."""
    rows = {r["key"]: row for r in sorted(runs, key=lambda r: -r["repeat"]) if (row := r["row"])}
    cols = [c for c in CONFIG_KEY_COLUMNS if any(_given(row.get(c)) for row in rows.values())]
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{_e(row.get(c)) if _given(row.get(c)) else ''}</td>" for c in cols) + "</tr>"
        for row in rows.values()
    )
    return f'<table id="config" class="env"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _given(v: object) -> bool:
    return v is not None and str(v) not in ("", "nan", "None")


def _kv_table(d: Mapping[str, object]) -> str:
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in d.items())
    return f'<table class="env">{rows}</table>'


def render_html(doc: RunDocument, source: str = "") -> str:
    runs = runs_of(doc)
    entries: list[Entry] = [(r["key"], r["row"], None) for r in runs if r["row"] is not None]

    cfg = doc.get("config") or {}
    goodput = parse_goodput(
        [g for item in as_list(cfg.get("goodput") or []) for g in str(item).replace(",", " ").split()]
    )
    wl = as_object(doc.get("workload") or {})
    title = (
        table_title(str(wl.get("name", "?")), as_object(wl["summary"]), as_object(wl.get("params") or {}), doc["rows"])
        if wl.get("summary")
        else source
    )
    notes = "".join(f"<li>{_e(line)}</li>" for line in summary_lines(entries, goodput))
    timeline = timeline_html(runs) or (
        '<p class="empty">no per-step request ids in this JSON (made by an older cbbench, or no refengine run)</p>'
    )
    cmd = next((r.get("command") for r in doc["rows"] if r.get("command")), None) or cfg.get("command")
    command = f'<pre id="command">{_e(cmd)}</pre>' if cmd else ""
    png = latency_throughput_png(doc["rows"])
    sweep = (
        f'<section id="latency-throughput"><h2>Latency against throughput</h2><img id="latency-throughput-img"'
        f' alt="latency against throughput" src="data:image/png;base64,{png}"></section>'
        if png
        else ""
    )
    data = embed_json(cdf_data(runs))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>cbbench report: {_e(wl.get("name", source))}</title><style>{CSS}</style></head>
<body>
<h1>cbbench perf report</h1>
<p class="sub">{_e(title)}</p>{command}
<section id="results-section"><h2>Results</h2><div class="scroll">{results_table(entries, goodput)}</div><ul class="notes">{notes}</ul>
<p class="sub">Medians over repeats; the CSV beside the JSON has every metric and the min / max of repeats.</p>
</section>
<section id="latency"><h2>Latency distributions</h2><div class="charts">
<div class="chart" id="ttft-cdf" data-chart="ttft"></div><div class="chart" id="itl-cdf" data-chart="itl"></div>
</div></section>
{sweep}{frontier_html(doc)}{server_metrics_html(doc)}
<section id="timeline" class="timeline"><h2>Slot timeline</h2>{timeline}</section>
<section id="environment"><h2>Environment</h2>{_kv_table(doc.get("environment") or {})}
<h2>Configuration</h2><p class="sub">As the engine resolved it, per configuration (the CSV's config columns).</p>
<div class="scroll">{resolved_config(runs)}</div></section>
<script type="application/json" id="cdf-data">{data}</script>
<script>{JS}</script>
</body></html>
"""


def embed_json(data: object) -> str:
    """`data` as JSON that can sit inside a <script> element: `<`, `>` and `&` as JSON's \\u escapes (which
    JSON.parse reads back), so no string in it (`</script>`, `<!--<script>`) can end or change the element."""
    text = json.dumps(data)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def write_report(run_json: str | Path, out: str | Path | None = None) -> Path:
    doc = load_run(run_json)
    path = Path(out) if out is not None else Path(run_json).with_suffix(".html")
    if path.is_dir():
        path = path / Path(run_json).with_suffix(".html").name
    try:
        page = render_html(doc, source=Path(run_json).name)
    except (TypeError, KeyError, AttributeError, IndexError, OverflowError) as e:  # a hand-edited or damaged JSON
        raise ValueError(f"{run_json}: malformed run JSON ({type(e).__name__}: {e})") from None
    atomic_write_text(path, page)  # refuses a device (`-o /dev/full`) and never leaves half a page
    return path
