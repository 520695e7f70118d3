"""`cbbench plot RESULT.csv`: the seed's max_num_batched_tokens trade-off (§4, self-check 5) from a sweep.

Two panels against the swept knob: TTFT (mean solid, p99 dashed) and output throughput, one line per
(engine, batching mode); repeats are reduced to their median first.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .results import CONFIG_KEY_COLUMNS, aggregate_repeats, read_csv

PLOT_METRICS = ("mean_ttft_ms", "p99_ttft_ms", "output_throughput")


def plot_sweep(csv_path: str | Path, *, knob: str = "max_num_batched_tokens", out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if knob not in CONFIG_KEY_COLUMNS:
        raise ValueError(f"knob: {knob!r} is not a config column; expected one of {', '.join(CONFIG_KEY_COLUMNS)}")
    df = aggregate_repeats(read_csv(csv_path), PLOT_METRICS)
    df = df[pd.to_numeric(df[knob], errors="coerce").notna()]
    if df.empty:
        raise ValueError(f"{csv_path}: no row has a value for {knob}")
    df[knob] = pd.to_numeric(df[knob])
    fig, (ax_t, ax_p) = plt.subplots(1, 2, figsize=(11, 4))
    for (engine, batching), g in df.groupby(["engine", "batching"], sort=False):
        g = g.sort_values(knob)
        label = batching if engine == "refengine" else f"{engine} ({batching})"
        line, = ax_t.plot(g[knob], g["mean_ttft_ms"], marker="o", label=f"{label} mean")
        ax_t.plot(g[knob], g["p99_ttft_ms"], marker="x", linestyle="--", color=line.get_color(), label=f"{label} p99")
        ax_p.plot(g[knob], g["output_throughput"], marker="o", color=line.get_color(), label=label)
    for ax, ylabel in ((ax_t, "TTFT (ms)"), (ax_p, "output throughput (tok/s)")):
        ax.set_xlabel(knob)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if df[knob].nunique() > 1 and df[knob].min() > 0 and df[knob].max() / df[knob].min() >= 8:
            ax.set_xscale("log", base=2)
    ax_t.legend(fontsize=7)
    ax_p.legend(fontsize=7)
    fig.suptitle(f"{Path(csv_path).name}: TTFT and throughput against {knob}", fontsize=10)
    fig.tight_layout()
    out = Path(out) if out is not None else Path(csv_path).with_suffix(f".{knob}.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
