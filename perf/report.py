"""The terminal table of `cbbench perf`: one row per (engine, batching, knob set), medians over repeats, the ratio of
each refengine mode to `static` at the same knobs, and of refengine-continuous to each peer."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

Key = tuple[str, str, str]  # engine, batching, knob label
Entry = tuple[Key, Mapping[str, Any] | None, str | None]  # key, CSV row (None if failed), error

# (header, row key, format)
COLUMNS = (
    ("out tok/s", "output_throughput", "{:.1f}"), ("total tok/s", "total_token_throughput", "{:.1f}"),
    ("req/s", "request_throughput", "{:.2f}"), ("TTFT mean ms", "mean_ttft_ms", "{:.0f}"),
    ("TTFT p99 ms", "p99_ttft_ms", "{:.0f}"), ("TPOT mean ms", "mean_tpot_ms", "{:.1f}"),
    ("ITL mean ms", "mean_itl_ms", "{:.1f}"), ("preempt", "num_preemptions", "{:.0f}"),
    ("peak KV blk", "peak_kv_blocks", "{:.0f}"), ("slot util", "mean_slot_utilisation", "{:.0%}"),
    ("slot waste", "slot_waste", "{:.2f}x"),
)


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _median(vals: Sequence[float]) -> float:
    vals = [v for v in vals if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def _fmt(fmt: str, v: float) -> str:
    return "" if math.isnan(v) else fmt.format(v)


def summarise(entries: Sequence[Entry]) -> tuple[dict[Key, dict[str, float]], dict[Key, str]]:
    """Per key: the median of every metric over its repeats (+ spread of output_throughput); failures by key."""
    by_key: dict[Key, list[Mapping[str, Any]]] = {}
    failed: dict[Key, str] = {}
    for key, row, error in entries:
        if row is None:
            failed[key] = error or "failed"
        else:
            by_key.setdefault(key, []).append(row)
    out: dict[Key, dict[str, float]] = {}
    for key, rows in by_key.items():
        med = {m: _median([_num(r.get(m)) for r in rows]) for _, m, _ in COLUMNS}
        tp = [_num(r.get("output_throughput")) for r in rows]
        med["spread"] = (max(tp) - min(tp)) / 2 / med["output_throughput"] if len(rows) > 1 else math.nan
        med["repeats"] = len(rows)
        out[key] = med
    return out, failed


def ratios(med: Mapping[Key, Mapping[str, float]]) -> tuple[dict[Key, float], dict[Key, float]]:
    """(mode / static at the same knobs, refengine-continuous / peer at the same max_num_seqs)."""
    vs_static, cont_vs_peer = {}, {}
    for (eng, mode, label), m in med.items():
        if eng == "refengine":
            base = med.get((eng, "static", label))
            if base:
                vs_static[(eng, mode, label)] = m["output_throughput"] / base["output_throughput"]
        else:  # a peer: label holds max_num_seqs only when it varies; match refengine rows that mention it
            conts = [v for (e, b, lab), v in med.items() if e == "refengine" and b == "continuous"
                     and (label == "-" or label in lab.split())]
            if conts:
                cont_vs_peer[(eng, mode, label)] = conts[0]["output_throughput"] / m["output_throughput"]
    return vs_static, cont_vs_peer


def render_perf_table(entries: Sequence[Entry], workload: Any) -> Group:
    med, failed = summarise(entries)
    vs_static, vs_peer = ratios(med)
    s = workload.summary()
    title = (f"cbbench perf: {workload.name}, {s['num_requests']} requests, prompt mean {s['mean_prompt_len']:.0f} "
             f"(max {s['max_prompt_len']}), output mean {s['mean_output_len']:.0f} (max {s['max_output_len']}, "
             f"cv {s['cv_output_len']:.2f})")
    t = Table(title=title, title_justify="left")
    for h in ("engine", "batching", "knobs"):
        t.add_column(h, no_wrap=True)
    for h, _, _ in COLUMNS:
        t.add_column(h, justify="right")
    t.add_column("÷ static", justify="right")
    t.add_column("cont ÷ this", justify="right")
    for key in [*med, *(k for k in failed if k not in med)]:
        if key not in med:
            t.add_row(*key, Text(f"failed: {failed[key]}", style="red"), *[""] * (len(COLUMNS) + 1))
            continue
        m = med[key]
        cells = [_fmt(f, m[k]) for _, k, f in COLUMNS]
        if not math.isnan(m["spread"]):
            cells[0] += f" ±{m['spread']:.0%}"
        t.add_row(*key, *cells, _fmt("{:.2f}x", vs_static.get(key, math.nan)), _fmt("{:.2f}x", vs_peer.get(key, math.nan)))
    lines = []
    for (eng, mode, label), r in vs_static.items():
        if mode == "continuous":
            waste = med.get((eng, "static", label), {}).get("slot_waste", math.nan)
            lines.append(f"continuous / static output throughput{'' if label == '-' else ' (' + label + ')'}: "
                         f"{r:.2f}x (static's slot waste {waste:.2f}x: the most continuous can win back)")
    for (eng, _, label), r in vs_peer.items():
        lines.append(f"refengine continuous / {eng}{'' if label == '-' else ' (' + label + ')'}: {r:.2f}x")
    for key, e in failed.items():
        lines.append(f"{key[0]} {key[1]} failed: {e}")
    return Group(t, *(Text(line) for line in lines))
