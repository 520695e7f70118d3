"""`cbbench plot A.csv [B.csv ...]`: result CSVs as pictures, one curve per (CSV label, engine, batching mode, other
varying knobs), repeats reduced to their median with min-max error bars.

Two kinds, chosen from the data (`kind="auto"`):
- `latency`, when the CSVs hold a request-rate sweep: the standard latency-against-throughput curve. Panels of
  TTFT, TPOT and end-to-end latency (mean solid, p99 dashed) against output throughput, one point per request rate,
  labelled with its rate; a curve that bends up is the engine reaching saturation.
- `sweep`, otherwise: the max_num_batched_tokens trade-off: TTFT (mean, p99) and output
  throughput against a swept knob.
Ticks are plain numbers (no scientific notation, no offset), so the axes read as the table does. A value axis (the
latencies, the throughputs) is logarithmic where its values spread over more than two decades, by the rule of
axis_scale.py that `cbbench report`'s CDFs follow too; a swept knob's axis is log base 2 over a range of 8x or more.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cbbench.perf.report.axis_scale import choose_axis
from cbbench.perf.report.plot_data import choose_kind, curves, load_results, not_a_sweep, plain_number, request_rates
from cbbench.perf.results.columns import CONFIG_KEY_COLUMNS

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.typing import ColorType

LATENCY_PANELS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"), ("e2el", "end-to-end latency (ms)"))


def _arr(v: pd.Series) -> npt.NDArray[np.float64]:
    import numpy as np

    return np.asarray(pd.to_numeric(pd.Series(v)), dtype=float)


def _errorbars(
    ax: Axes,
    x: pd.Series,
    y: pd.Series,
    g: pd.DataFrame,
    metric: str,
    xmetric: str | None,
    *,
    marker: str,
    label: str,
    color: ColorType | None = None,
) -> Line2D:
    """A line with min-max error bars when the points have repeats, else a plain line."""
    xs, ys = _arr(x), _arr(y)
    if (g["num_repeats"] > 1).any():
        yerr = [ys - _arr(g[f"{metric}_min"]), _arr(g[f"{metric}_max"]) - ys]
        xerr = [xs - _arr(g[f"{xmetric}_min"]), _arr(g[f"{xmetric}_max"]) - xs] if xmetric else None
        bars = ax.errorbar(xs, ys, yerr=yerr, xerr=xerr, capsize=3, marker=marker, label=label, color=color)
        return bars.lines[0]  # (the data line: the container's first item)
    return ax.plot(xs, ys, marker=marker, label=label, color=color)[0]


def _plot_latency(df: pd.DataFrame, axes: Sequence[Axes], named: bool = False) -> str:
    df = df.assign(_rate=request_rates(df))
    for name, g in curves(df, "request_rate", named):
        g = g.sort_values("_rate")
        x = g["output_throughput"]
        color: ColorType | None = None
        for ax, (m, _) in zip(axes, LATENCY_PANELS):
            line = _errorbars(
                ax,
                x,
                g[f"mean_{m}_ms"],
                g,
                f"mean_{m}_ms",
                "output_throughput",
                marker="o",
                label=f"{name} mean",
                color=color,
            )
            color = line.get_color()
            ax.plot(
                _arr(x),
                _arr(g[f"p99_{m}_ms"]),
                marker="x",
                linestyle="--",
                color=color,
                linewidth=1,
                label=f"{name} p99",
            )
            for xi, yi, r in zip(x, g[f"mean_{m}_ms"], g["_rate"]):
                ax.annotate(
                    "inf" if math.isinf(r) else f"{plain_number(r)}/s",
                    (xi, yi),
                    fontsize=6,
                    textcoords="offset points",
                    xytext=(4, 4),
                )
    for ax, (_, ylabel) in zip(axes, LATENCY_PANELS):
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(ylabel)
    return "latency against throughput across request rates"


def _plot_sweep(df: pd.DataFrame, axes: Sequence[Axes], knob: str, named: bool = False) -> str:
    if knob not in CONFIG_KEY_COLUMNS:
        raise ValueError(f"knob: {knob!r} is not a config column; expected one of {', '.join(CONFIG_KEY_COLUMNS)}")
    has_x = pd.to_numeric(df[knob], errors="coerce").notna()
    if pd.to_numeric(df[knob], errors="coerce").nunique() < 2:
        raise not_a_sweep(df, knob)
    df, flat = df[has_x].copy(), df[~has_x]
    df[knob] = pd.to_numeric(df[knob])
    ax_t, ax_p = axes
    for name, g in curves(flat, knob, named) if not flat.empty else []:
        # a peer without this knob (HF, another server) is one level across the whole sweep, not left out
        color: ColorType | None = None
        for ax, metric in ((ax_t, "mean_ttft_ms"), (ax_p, "output_throughput")):
            color = ax.axhline(
                float(pd.to_numeric(g[metric]).median()), linestyle=":", color=color, label=f"{name} (no {knob})"
            ).get_color()
    for name, g in curves(df, knob, named):
        g = g.sort_values(knob)
        line = _errorbars(ax_t, g[knob], g["mean_ttft_ms"], g, "mean_ttft_ms", None, marker="o", label=f"{name} mean")
        ax_t.plot(
            _arr(g[knob]),
            _arr(g["p99_ttft_ms"]),
            marker="x",
            linestyle="--",
            color=line.get_color(),
            label=f"{name} p99",
        )
        _errorbars(
            ax_p,
            g[knob],
            g["output_throughput"],
            g,
            "output_throughput",
            None,
            marker="o",
            color=line.get_color(),
            label=name,
        )
    for ax, ylabel in ((ax_t, "TTFT (ms)"), (ax_p, "output throughput (tok/s)")):
        ax.set_xlabel(knob)
        ax.set_ylabel(ylabel)
        if df[knob].nunique() > 1 and df[knob].min() > 0 and df[knob].max() / df[knob].min() >= 8:
            ax.set_xscale("log", base=2)
    return f"TTFT and throughput against {knob}"


def _value_scale(ax: Axes, which: str) -> None:
    """Make a value axis logarithmic, with the range and decade ticks of axis_scale.choose_axis, when the data drawn
    on it (lines and error bars) spreads over more than two decades; a linear one keeps matplotlib's own range."""
    lim = ax.dataLim
    lo, hi = (lim.y0, lim.y1) if which == "y" else (lim.x0, lim.x1)
    axis = choose_axis([lo, hi])
    if axis.scale != "log":
        return
    if which == "y":
        ax.set_yscale("log")
        ax.set_ylim(axis.lo, axis.hi)
        ax.set_yticks(axis.ticks)
    else:
        ax.set_xscale("log")
        ax.set_xlim(axis.lo, axis.hi)
        ax.set_xticks(axis.ticks)


def default_out(csv_path: str | Path, kind: str, knob: str) -> Path:
    return Path(csv_path).with_suffix(".latency-throughput.png" if kind == "latency" else f".{knob}.png")


def make_figure(
    csv_paths: Sequence[str | Path],
    *,
    labels: Sequence[str] | None = None,
    kind: str = "auto",
    knob: str = "max_num_batched_tokens",
) -> tuple[Figure, str]:
    """The figure (the caller closes it) and the kind drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    df = load_results(csv_paths, labels)
    kind = choose_kind(df, kind)
    npanels = len(LATENCY_PANELS) if kind == "latency" else 2
    fig, grid = plt.subplots(1, npanels, figsize=(5.2 * npanels, 4.2), squeeze=False)
    axes = list(grid[0])
    try:
        named = bool(labels)
        what = _plot_latency(df, axes, named) if kind == "latency" else _plot_sweep(df, axes, knob, named)
    except Exception:
        plt.close(fig)
        raise
    for ax in axes:
        _value_scale(ax, "y")
        if kind == "latency":
            _value_scale(ax, "x")  # output throughput: a value axis too (a sweep's x is its knob)
        ax.grid(alpha=0.3)
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FuncFormatter(plain_number))
            axis.set_minor_formatter(NullFormatter())
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{', '.join(Path(p).name for p in csv_paths)}: {what}", fontsize=10)
    fig.tight_layout()
    return fig, kind


def plot_results(
    csv_paths: Sequence[str | Path],
    *,
    labels: Sequence[str] | None = None,
    kind: str = "auto",
    knob: str = "max_num_batched_tokens",
    out: str | Path | None = None,
) -> Path:
    """Draw the CSVs (see the module docstring); returns the PNG written. `out` may be a folder."""
    import matplotlib.pyplot as plt

    fig, kind = make_figure(csv_paths, labels=labels, kind=kind, knob=knob)
    try:
        default = default_out(csv_paths[0], kind, knob)
        path = Path(out) if out is not None else default
        if path.is_dir() or str(out).endswith(("/", os.sep)):  # `--out plots/`: a folder, made if missing
            path = path / default.name
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    return path


def plot_sweep(csv_path: str | Path, *, knob: str = "max_num_batched_tokens", out: str | Path | None = None) -> Path:
    """One CSV against a swept knob (the original `cbbench plot`)."""
    return plot_results([csv_path], kind="sweep", knob=knob, out=out)
