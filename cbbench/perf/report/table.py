"""The terminal table of `cbbench perf`: one row per (engine, batching, knob set), medians over repeats, the ratio of
each refengine mode to `static` at the same knobs, and of refengine-continuous to each peer.

Every ratio is of output throughput, read from the repeats of both sides with the statistics the gate uses
(cbbench/perf/stats.py): the Hodges-Lehmann ratio and its exact 95 % interval, "within noise" where that interval
holds 1 ("noise" in a cell), and "no interval" where the repeats are too few for one (a single run each). A simulated
run has no run-to-run noise: its single run's ratio is exact and says so.

The table fits the terminal: a column with no value in any row is left out, and when the rest is wider than the
terminal, the least important columns go first (their names are listed under the table; the CSV has them all).
Headers wrap at spaces before any column is dropped. Without a terminal (CI logs, a pipe) and without `COLUMNS`,
the table keeps its natural width: a log file does not wrap.
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

from rich.cells import cell_len
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from cbbench.perf.client_lag import lag_line
from cbbench.perf.json_values import JSONObject
from cbbench.perf.report.table_title import cell_number, simulated_heading, table_title
from cbbench.perf.stats import RATIO_CONFIDENCE, Shift, describe_ratio, ratio_interval, repeats_for_interval
from cbbench.perf.steady_state import NOTE_COLUMN
from refengine.sim.sim_device import DeviceSpec

Key = tuple[str, str, str]  # engine, batching, knob label
# A results row as the table reads it: by column name, each cell a number, text or empty (a row `make_row` made, one
# `read_rows` read back, or one `--resume` kept as written): `cell_number` reads a metric, `str()` a name.
TableRow = Mapping[str, object]
Entry = tuple[Key, TableRow | None, str | None]  # key, CSV row (None if failed), error


class ReportRun(TypedDict):
    """One measured run as `cbbench report` draws it (html.py's `runs_of`; its slot timeline, timeline_svg.py): its
    label and its parts, its CSV row, its request records and its steps (their JSON entries, perf/records.py)."""

    label: str
    key: Key
    repeat: int
    row: TableRow | None
    records: list[JSONObject]
    steps: list[JSONObject]


class TableWorkload(Protocol):
    """What the table's title needs of a workload (a `workloads.Workload`, or show.py's `SavedWorkload`)."""

    @property
    def name(self) -> str: ...

    @property
    def params(self) -> Mapping[str, object]: ...

    def summary(self) -> Mapping[str, object]: ...


class RatioRecord(TypedDict):
    """A ratio as the JSON outputs hold it (`ratio_record`)."""

    ratio: float
    low: float | None
    high: float | None
    within_noise: bool | None
    runs: list[int]
    text: str


PERCENT = "percent"  # a COLUMNS format: `percent(v)`
# (header, row key, format, priority): a narrow terminal drops the highest priority number first
COLUMNS = (
    ("out tok/s", "output_throughput", "{:.1f}", 0),
    ("total tok/s", "total_token_throughput", "{:.1f}", 7),
    ("req/s", "request_throughput", "{:.2f}", 6),
    ("goodput req/s", "request_goodput", "{:.2f}", 1),
    ("TTFT mean ms", "mean_ttft_ms", "{:.0f}", 2),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.0f}", 8),
    ("TPOT mean ms", "mean_tpot_ms", "{:.1f}", 3),
    ("ITL mean ms", "mean_itl_ms", "{:.1f}", 9),
    ("preempt", "num_preemptions", "{:.0f}", 10),
    ("peak KV blk", "peak_kv_blocks", "{:.0f}", 11),
    ("peak KV", "peak_kv_usage", PERCENT, 12),
    ("slot util", "mean_slot_utilisation", PERCENT, 5),
    ("slot waste", "slot_waste", "{:.2f}x", 4),
    ("prefix hit", "prefix_cache_hit_rate", PERCENT, 3),
)
RATIO_PRIORITY = 1  # "÷ static" and "cont ÷ this": the table's point
# `--steady-state`: the figures over the window where the server held its load (perf/steady_state.py), asked for
STEADY_COLUMNS = (
    ("steady out tok/s", "steady_output_throughput", "{:.1f}", 1),
    ("steady TTFT p50 ms", "steady_median_ttft_ms", "{:.0f}", 2),
    ("steady TPOT p50 ms", "steady_median_tpot_ms", "{:.1f}", 3),
    ("steady ITL p50 ms", "steady_median_itl_ms", "{:.1f}", 9),
)
# The prefix-hit column is shown only where some configuration's median hit rate reaches this share of its prompt
# tokens: a run whose prompts were served from an earlier run's cache hits most of them (a warm repeat of sharegpt
# against cbbench serve: 90 %, docs/measurements.md), a cold run of distinct prompts none; below 5 % the cached
# tokens change a run's prefill work, and so its TTFT, by less than this machine's run-to-run noise.
PREFIX_HIT_SHOWN = 0.05


@dataclass
class Column:
    header: str
    cells: list[str | Text]
    priority: int  # -1: never dropped
    justify: JustifyMethod = "right"
    wrap: bool = False  # cells may wrap at spaces (the knob label of a sweep can be long)

    @property
    def empty(self) -> bool:
        return all(not str(c).strip() or str(c) == "-" for c in self.cells)


def _median(vals: Sequence[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def percent(v: float) -> str:
    """A share in whole percent, for the table (text, markdown, HTML) and the HTML timeline alike ('' for nan). A
    share above 0 that rounds to 0% reads "<1%": 58 of 16384 KV blocks were used, and "0%" would say none were."""
    if math.isnan(v):
        return ""
    text = f"{v:.0%}"
    return "<1%" if v > 0 and text == "0%" else text


def _fmt(fmt: str, v: float) -> str:
    if fmt == PERCENT:
        return percent(v)
    return "" if math.isnan(v) else fmt.format(v)


def summarise(
    entries: Sequence[Entry], *, steady_state: bool = False
) -> tuple[dict[Key, dict[str, float]], dict[Key, str]]:
    """Per key: the median of every metric over its repeats (+ spread of output_throughput), the steady-state
    figures too when asked; failures by key."""
    by_key: dict[Key, list[TableRow]] = {}
    failed: dict[Key, str] = {}
    for key, row, error in entries:
        if row is None:
            failed[key] = error or "failed"
        else:
            by_key.setdefault(key, []).append(row)
    out: dict[Key, dict[str, float]] = {}
    for key, rows in by_key.items():
        shown = (*COLUMNS, *(STEADY_COLUMNS if steady_state else ()))
        med = {m: _median([cell_number(r.get(m)) for r in rows]) for _, m, _, _ in shown}
        tp = [cell_number(r.get("output_throughput")) for r in rows]
        med["spread"] = (max(tp) - min(tp)) / 2 / med["output_throughput"] if len(rows) > 1 else math.nan
        med["repeats"] = len(rows)
        out[key] = med
    return out, failed


def _throughputs(entries: Sequence[Entry]) -> dict[Key, list[float]]:
    """Per key, the output throughput of each repeat that has one (a ratio needs positive, finite samples)."""
    out: dict[Key, list[float]] = {}
    for key, row, _ in entries:
        v = cell_number(row.get("output_throughput")) if row is not None else math.nan
        if math.isfinite(v) and v > 0:
            out.setdefault(key, []).append(v)
    return out


def ratios(entries: Sequence[Entry]) -> tuple[dict[Key, Shift], dict[Key, Shift]]:
    """(each refengine mode / static at the same knobs, refengine-continuous / each peer at the same max_num_seqs):
    output throughput, each with its interval over the repeats of both sides."""
    tp = _throughputs(entries)
    vs_static, cont_vs_peer = {}, {}
    for (eng, mode, label), samples in tp.items():
        if eng == "refengine":
            base = tp.get((eng, "static", label))
            if base and mode != "static":  # (static over itself is 1 by definition: no test)
                vs_static[(eng, mode, label)] = ratio_interval(base, samples)
        else:  # a peer: label holds max_num_seqs only when it varies; match refengine rows that mention it
            conts = [
                v
                for (e, b, lab), v in tp.items()
                if e == "refengine" and b == "continuous" and (label == "-" or label in lab.split())
            ]
            if conts:
                cont_vs_peer[(eng, mode, label)] = ratio_interval(samples, conts[0])
    return vs_static, cont_vs_peer


def ratio_record(s: Shift) -> RatioRecord:
    """A ratio as the JSON outputs hold it: estimate, interval (null without one), runs, and whether within noise."""
    return {
        "ratio": s.ratio,
        "low": s.low if s.bounded else None,
        "high": s.high if s.bounded else None,
        "within_noise": s.within_noise if s.bounded else None,
        "runs": [s.n_base, s.n_head],
        "text": describe_ratio(s),
    }


def table_columns(
    entries: Sequence[Entry], *, goodput: Mapping[str, float] | None = None, steady_state: bool = False
) -> list[Column]:
    """Every column of the table, in display order, with its cells already formatted."""
    med, failed = summarise(entries, steady_state=steady_state)
    vs_static, vs_peer = ratios(entries)
    keys = [*med, *(k for k in failed if k not in med)]
    cols = [
        Column(h, [k[i] for k in keys], -1, "left", wrap=h == "knobs")
        for i, h in enumerate(("engine", "batching", "knobs"))
    ]
    for j, (header, metric, fmt, prio) in enumerate((*COLUMNS, *(STEADY_COLUMNS if steady_state else ()))):
        if metric == "request_goodput" and not goodput:
            continue  # without --goodput every request counts, and the column would repeat req/s
        if metric == "prefix_cache_hit_rate" and not any(
            med[k][metric] >= PREFIX_HIT_SHOWN for k in keys if k in med
        ):  # (NaN compares False: a run that could not see its hits shows none)
            continue
        cells: list[str | Text] = []
        for key in keys:
            if key not in med:
                cells.append(Text("failed", style="red") if j == 0 else "")
                continue
            cell = _fmt(fmt, med[key][metric])
            if j == 0 and not math.isnan(med[key]["spread"]):
                cell += f" ±{med[key]['spread']:.0%}"
            cells.append(cell)
        cols.append(Column(header, cells, prio))
    sim = _simulated(entries)
    for header, rs in (("÷ static", vs_static), ("cont ÷ this", vs_peer)):
        cells = [
            _ratio_text(rs[k], sim, short=True) if k in rs else "1.00x" if _is_static_base(k, rs) else "" for k in keys
        ]
        cols.append(Column(header, list(cells), RATIO_PRIORITY))
    return cols


def _ratio_text(s: Shift, simulated: bool, *, short: bool) -> str:
    """A ratio as a cell (`short`) or in a sentence: with its interval, or, on a simulated device without one,
    exact (every run of it gives the same numbers)."""
    if simulated and not s.bounded:
        return f"{s.ratio:.2f}x" if short else f"{s.ratio:.2f}x (simulated: the same every run)"
    return describe_ratio(s, short=short)


def _simulated(entries: Sequence[Entry]) -> bool:
    rows = [row for _, row, _ in entries if row]
    return bool(rows) and all(_device(row).simulated for row in rows)


def _is_static_base(key: Key, vs_static: Mapping[Key, Shift]) -> bool:
    """The static row other refengine rows are divided by (its own "÷ static" is 1, no test)."""
    eng, mode, label = key
    return eng == "refengine" and mode == "static" and any(k[0] == eng and k[2] == label for k in vs_static)


def _need(c: Column) -> int:
    """The narrowest a column may be: its widest cell, or its header's longest word (the header wraps at spaces)."""
    cells = [w for x in c.cells for w in str(x).split()] if c.wrap else [str(x) for x in c.cells]
    return max([cell_len(x) for x in cells] + [max(cell_len(w) for w in c.header.split())])


def _natural(c: Column) -> int:
    return max([cell_len(str(x)) for x in c.cells] + [cell_len(c.header)])


def _total(widths: Sequence[int]) -> int:
    return sum(widths) + 3 * len(widths) + 1  # the box: one space of padding each side, a rule between and outside


def _build(title: str, cols: Sequence[Column], widths: Sequence[int] | None = None) -> Table:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(cols):
        t.add_column(
            c.header, justify=c.justify, no_wrap=c.priority == -1 and not c.wrap, width=widths[i] if widths else None
        )
    for row in zip(*(c.cells for c in cols)):
        t.add_row(*row)
    return t


def fit_columns(cols: Sequence[Column], width: int | None) -> tuple[list[Column], list[int] | None, list[str]]:
    """Drop empty columns, then the least important ones until the table fits `width` (None: no limit).
    Returns the columns kept, their widths (None: natural) and the headers dropped for width."""
    keep = [c for c in cols if not c.empty or (c.priority == -1 and c.header != "knobs")]
    dropped: list[str] = []
    while width is not None and _total([_need(c) for c in keep]) > width:
        droppable = [c for c in keep if c.priority >= 0]
        if not droppable:
            break
        worst = max(reversed(droppable), key=lambda c: c.priority)  # the last of the least important
        keep.remove(worst)
        dropped.append(worst.header)
    if width is None or _total([_natural(c) for c in keep]) <= width:
        return keep, None, dropped
    widths = [_need(c) for c in keep]
    spare = width - _total(widths)
    for i in sorted(range(len(keep)), key=lambda i: keep[i].priority):  # unwrap important headers first
        grow = _natural(keep[i]) - widths[i]
        if 0 < grow <= spare:
            widths[i] += grow
            spare -= grow
    return keep, widths, dropped


def table_width(console: Console) -> int | None:
    """The width to fit: the terminal's, or COLUMNS; None (natural width) when writing to a log or a pipe."""
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console.width
    return None


# On a CPU a step's cost grows with the batch (every row pays its own GEMMs), so the slots static batching leaves idle
# cost little and continuous batching wins little; on a GPU a decode step costs about the same at any batch size.
CPU_ECONOMICS = (
    "on a CPU a step costs more the more requests it holds, so static's idle slots cost little and continuous wins"
    " little; a GPU's economics, simulated: cbbench perf --device sim:h200 --workload sharegpt"
)


# The note under a table whose ratios have no interval (one run of a configuration, or too few): the main command's
# continuous / static read 0.57x, then 1.09x, one run each, back to back on a busy machine (issue 45)
NO_INTERVAL = (
    f"a ratio needs {repeats_for_interval()} or more runs of each side for a {RATIO_CONFIDENCE:.0%} interval, and one"
    f" run's ratio can be off by 2x on a busy machine: --repeats {repeats_for_interval()} or more gives one"
)


RATIO_LEGEND = (
    f"÷ static, cont ÷ this: output throughput's Hodges-Lehmann ratio over the repeats, then its exact"
    f" {RATIO_CONFIDENCE:.0%} interval (the U test's, as `cbbench gate` reads it); noise: the interval holds 1, the runs"
    " cannot tell the two apart"
)


def summary_lines(
    entries: Sequence[Entry], goodput: Mapping[str, float] | None = None, *, steady_state: bool = False
) -> list[str]:
    """The sentences under the table: what goodput counted, the ratios that matter, the clients that lagged, the
    runs without a steady state (when asked for), the failures."""
    med, failed = summarise(entries)
    vs_static, vs_peer = ratios(entries)
    lines = []
    if goodput:
        slo = " and ".join(f"{k} <= {v:g} ms" for k, v in goodput.items())
        lines.append(f"goodput: requests per second that met {slo}")
    cpu = any(_device(row).is_cpu for _, row, _ in entries if row)
    sim = _simulated(entries)
    for (eng, mode, label), r in vs_static.items():
        if mode == "continuous":
            waste = med.get((eng, "static", label), {}).get("slot_waste", math.nan)
            lines.append(
                f"continuous / static output throughput{'' if label == '-' else ' (' + label + ')'}: "
                f"{_ratio_text(r, sim, short=False)} (static's slot waste {waste:.2f}x: the most continuous can win back)"
            )
    for (eng, _, label), r in vs_peer.items():
        lines.append(
            f"refengine continuous / {eng}{'' if label == '-' else ' (' + label + ')'}: {_ratio_text(r, sim, short=False)}"
        )
    shown = [*vs_static.values(), *vs_peer.values()]
    if any(r.bounded for r in shown):
        lines.append(RATIO_LEGEND)
    if not sim and any(not r.bounded for r in shown):
        lines.append(NO_INTERVAL)
    if cpu and any(mode == "continuous" for _, mode, _ in vs_static):
        lines.append(CPU_ECONOMICS)
    lines += graphed_lines(entries)
    lines += client_lines(entries, steady_state=steady_state)
    for key, e in failed.items():
        lines.append(f"{key[0]} {key[1]} failed: {e}")
    if simulated_heading([row for _, row, _ in entries if row]):
        lines.append(
            "simulated: every time is the cost model's GPU time; hf-cb is not simulated (transformers' "
            "continuous batching has no cost-model twin)"
        )
    return lines


def _name(key: Key) -> str:
    eng, mode, label = key
    return " ".join(x for x in (eng, mode, "" if label == "-" else f"({label})") if x)


def client_lines(entries: Sequence[Entry], *, steady_state: bool = False) -> list[str]:
    """Per configuration: its client lagged (perf/client_lag.py), and, when the steady-state figures were asked
    for, why a run has none."""
    rows: dict[Key, list[TableRow]] = {}
    for key, row, _ in entries:
        if row is not None:
            rows.setdefault(key, []).append(row)
    lines = [line for key, rs in rows.items() if (line := lag_line(_name(key), rs))]
    if steady_state:
        for key, rs in rows.items():
            notes = sorted({str(r.get(NOTE_COLUMN)) for r in rs if r.get(NOTE_COLUMN)})
            lines += [f"{_name(key)}: {note}" for note in notes]
    return lines


def graphed_lines(entries: Sequence[Entry]) -> list[str]:
    """On CUDA, per configuration: the median share of steps and of scheduled tokens whose forward replayed a CUDA
    graph (perf/metrics.py's graphed_step_share / graphed_token_share, kept in each row's `extra`)."""
    shares: dict[Key, list[tuple[float, float]]] = {}
    for key, row, _ in entries:
        if row is None or not _device(row).is_cuda:
            continue
        extra = row.get("extra")
        d = json.loads(extra) if isinstance(extra, str) and extra.strip() else extra if isinstance(extra, dict) else {}
        if "graphed_step_share" in d:
            shares.setdefault(key, []).append((float(d["graphed_step_share"]), float(d["graphed_token_share"])))
    return [
        f"CUDA graphs, {eng} {mode}{'' if label == '-' else ' (' + label + ')'}: "
        f"{_median([s for s, _ in v]):.0%} of steps, {_median([t for _, t in v]):.0%} of scheduled tokens"
        for (eng, mode, label), v in shares.items()
    ]


def render_perf_table(
    entries: Sequence[Entry],
    workload: TableWorkload,
    *,
    width: int | None = None,
    goodput: Mapping[str, float] | None = None,
    steady_state: bool = False,
) -> Group:
    title = table_title(workload.name, workload.summary(), workload.params or {}, [row for _, row, _ in entries if row])
    cols, widths, dropped = fit_columns(table_columns(entries, goodput=goodput, steady_state=steady_state), width)
    lines = []
    if dropped:
        lines.append(Text(f"(too narrow for: {', '.join(dropped)}; widen the terminal, or see the CSV)", style="dim"))
    lines += [Text(line) for line in summary_lines(entries, goodput, steady_state=steady_state)]
    return Group(_build(title, cols, widths), *lines)


def print_perf_table(
    console: Console,
    entries: Sequence[Entry],
    workload: TableWorkload,
    *,
    goodput: Mapping[str, float] | None = None,
    steady_state: bool = False,
) -> None:
    """Print the table fitted to the console (see the module docstring)."""
    width = table_width(console)
    group = render_perf_table(entries, workload, width=width, goodput=goodput, steady_state=steady_state)
    if width is not None:
        console.print(group)
        return
    saved = console.width
    console.width = max(saved, _measure(group.renderables[0]).maximum)  # a log is as wide as the table wants
    try:
        console.print(group)
    finally:
        console.width = saved


def _measure(table: RenderableType) -> Measurement:
    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table)


def _device(row: TableRow) -> DeviceSpec:
    """The device a results row ran on (a name no longer known reads as neither CPU, CUDA nor simulated)."""
    name = str(row.get("device") or "")
    try:
        return DeviceSpec.parse(name)
    except ValueError:
        return DeviceSpec(name, "other")
