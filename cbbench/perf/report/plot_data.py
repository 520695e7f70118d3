"""`cbbench plot`'s data: result CSVs read into one table (repeats aggregated, a label per CSV), the kind of figure
the data calls for, and the split of the rows into named curves (perf/report/plot.py draws them).

A curve is told apart, and named, by every config column that varies across the rows (other than the x axis), and by
the workload parameters that vary; columns that are the same across a comparison (model, seed, ...) never split one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from cbbench.perf.results.columns import CONFIG_KEY_COLUMNS
from cbbench.perf.results.files import read_csv
from cbbench.perf.results.schema import aggregate_repeats

PLOT_METRICS = (
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
    "output_throughput",
    "request_throughput",
)
KINDS = ("auto", "latency", "sweep")
_NOT_A_CURVE = {"num_prompts", "seed", "model", "device", "dtype", "workload"}  # the same across a comparison


def plain_number(v: float, _pos: object = None) -> str:
    """A tick label without exponent or offset: 16384, 0.25, 1.5 (matplotlib's default writes 1e4 or +1.2e3)."""
    if not math.isfinite(v):
        return ""
    if float(v).is_integer():
        return str(int(v))
    s = f"{v:.6f}".rstrip("0").rstrip(".")
    return s if s not in ("0", "-0") else f"{v:.2g}"


def load_results(csv_paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Every CSV, repeats aggregated, with a `label` column: the given label, else the CSV's own `label` column
    (when it has one), else the file's stem."""
    if not csv_paths:
        raise ValueError("csv: give at least one results CSV")
    labels = list(labels or [])
    if labels and len(labels) != len(csv_paths):
        raise ValueError(f"label: {len(labels)} labels for {len(csv_paths)} CSVs; give one per CSV or none")
    frames = []
    for i, path in enumerate(csv_paths):
        df = read_csv(path)
        if labels:
            own = pd.Series(labels[i], index=df.index)
        elif "label" in df.columns and df["label"].notna().any():
            own = df["label"].fillna(Path(path).stem).astype(str)
        else:
            own = pd.Series(Path(path).stem, index=df.index)
        for lab, g in df.groupby(own, sort=False):
            agg = aggregate_repeats(g, PLOT_METRICS)
            agg.insert(0, "label", lab)
            frames.append(agg)
    return pd.concat(frames, ignore_index=True)


def request_rates(df: pd.DataFrame) -> pd.Series:
    """Each row's request rate; inf (every request at once) where the row has none."""
    return pd.to_numeric(df["request_rate"], errors="coerce").fillna(math.inf)


def choose_kind(df: pd.DataFrame, kind: str = "auto") -> str:
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if kind != "auto":
        return kind
    return "latency" if request_rates(df).nunique() > 1 else "sweep"


def curves(df: pd.DataFrame, x: str, named: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """Split into curves: every config column that varies (other than x) tells curves apart and names them;
    `named` (labels given with --label) puts the label in every name, even when there is only one."""
    df = df.assign(workload_params=df["workload_params"].map(_sample_params))
    varying = [
        c
        for c in ("label", *CONFIG_KEY_COLUMNS, "workload_params")
        if c != x and c not in _NOT_A_CURVE and df[c].astype(str).nunique() > 1
    ]
    if named and "label" not in varying:
        varying.insert(0, "label")
    if not varying:
        return [(_name(df.iloc[0], []), df)]
    params = [json.loads(c) if c else {} for c in df["workload_params"]]
    wp_varying = sorted(k for k in {k for p in params for k in p} if len({str(p.get(k)) for p in params}) > 1)
    out = []
    for _, g in df.groupby([df[c].astype(str) for c in varying], sort=False):
        p = json.loads(g.iloc[0]["workload_params"] or "{}")
        out.append((" ".join([_name(g.iloc[0], varying), *(f"{k}={p.get(k)}" for k in wp_varying)]), g))
    return out


def _sample_params(cell: object) -> str:
    """A workload_params cell less what has its own column (the request rate of a rate sweep, the seed)."""
    if not isinstance(cell, str) or not cell:
        return ""
    params = json.loads(cell)
    return json.dumps({k: v for k, v in params.items() if k not in CONFIG_KEY_COLUMNS}, sort_keys=True)


def _given(v: object) -> bool:
    """A cell that holds a value (not NaN, None or ''): only those go into a curve's name."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and str(v) not in ("", "nan", "None")


def _name(row: pd.Series, varying: Sequence[str]) -> str:
    parts = [str(row["label"])] if "label" in varying and _given(row["label"]) else []
    if row["engine"] == "refengine":
        parts.append(str(row["batching"]))
    else:
        parts.append(f"{row['engine']} ({row['batching']})" if _given(row["batching"]) else str(row["engine"]))
    parts += [
        f"{c}={row[c]}"
        for c in varying
        if c not in ("label", "engine", "batching", "workload_params") and _given(row[c])
    ]
    return " ".join(parts)


def not_a_sweep(df: pd.DataFrame, knob: str) -> ValueError:
    """Why a CSV whose rows share one x cannot be drawn against it, and what would make a sweep."""
    others = [
        c
        for c in CONFIG_KEY_COLUMNS
        if c != knob and c not in _NOT_A_CURVE and pd.to_numeric(df[c], errors="coerce").dropna().nunique() > 1
    ]
    hint = (
        f"; {', '.join(others)} varies: try --knob {others[0]}"
        if others
        else "; sweep a knob (e.g. --max-num-batched-tokens 256,1024) or --request-rate (e.g. 1,2,4)"
    )
    values = pd.to_numeric(df[knob], errors="coerce").dropna().unique()
    have = f"every row has {knob}={plain_number(values[0])}" if len(values) else f"no row has a value for {knob}"
    return ValueError(f"csv: not a sweep ({have}){hint}")
