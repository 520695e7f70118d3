"""Operator-level validation: each interior grid line of a measured table is left out in turn and predicted from
the rest by the same interpolation the cost model uses; the relative errors against the measured values.

Shared by test_kernel_tables.py (which pins them) and docs/sim-validation.md (whose table they produce:
`python -m refengine.tests.sim.held_out`).
"""

from __future__ import annotations

import statistics

import numpy as np

from refengine.sim.kernel_tables import AttentionTable, GemmCurve, attention_table, load_tables, make_gemm_grid

# the GEMM region the presets use: every linear of Qwen2.5-0.5B .. OPT-13B has n and k in [512, 65536]
MIN_NK = 512
MAX_M = 8192  # the largest step vLLM schedules by default (max_num_batched_tokens)
# the attention head shape of Llama-3.1-8B (and of most GQA presets): 32 query heads, 8 KV heads, head_dim 128
LLAMA_HEADS = (32, 8, 128)


def gemm_errors(gpu: str, dtype: str, axis: str) -> list[float]:
    """Leave out each interior m, n or k value (axis) in turn; predict the grid points on it."""
    a = load_tables(gpu).arrays  # the raw grid; the interpolation under test sees it with one line removed
    axes = {x: a[f"gemm_{dtype}_{x}"] for x in ("m", "n", "k")}
    ms = a[f"gemm_{dtype}_ms"]
    dim = "mnk".index(axis)
    errors: list[float] = []
    for idx in range(1, len(axes[axis]) - 1):
        if axis == "m" and axes["m"][idx] > MAX_M or axis != "m" and axes[axis][idx] < MIN_NK:
            continue
        rest = {x: np.delete(v, idx) if x == axis else v for x, v in axes.items()}
        grid = make_gemm_grid(rest["m"], rest["n"], rest["k"], np.delete(ms, idx, axis=dim))
        measured = np.take(ms, idx, axis=dim)  # the held-out plane
        for j, n in enumerate(axes["n"]):
            for i, k in enumerate(axes["k"]):
                if n < MIN_NK or k < MIN_NK or (axis == "n" and j != idx) or (axis == "k" and i != idx):
                    continue
                curve = GemmCurve(grid, int(n), int(k))
                for mi, m in enumerate(axes["m"]):
                    if axis == "m" and mi != idx or m > MAX_M:
                        continue
                    value = measured[j, i] if axis == "m" else measured[mi, i] if axis == "n" else measured[mi, j]
                    if np.isfinite(value):
                        errors.append(abs(curve.ms(int(m)) / float(value) - 1))
    return errors


def attention_errors(gpu: str, kind: str, kv_dtype: str = "bfloat16") -> list[float]:
    """Leave out each interior length of the Llama head shape's table; predict it at every batch size."""
    rows = load_tables(gpu).arrays[f"{kind}_{kv_dtype}"].astype(np.float64)
    h, kvh, d = LLAMA_HEADS
    rows = rows[(rows[:, 0] == h) & (rows[:, 1] == kvh) & (rows[:, 2] == d)]
    batch, ms = rows[:, 3], rows[:, 6]
    length = rows[:, 4] + rows[:, 5] if kind == "decode" else rows[:, 4]
    power = 1.0 if kind == "decode" else 2.0
    lengths = np.unique(length)
    errors: list[float] = []
    for held in lengths[1:-1]:
        keep = length != held
        table = AttentionTable(batch[keep], length[keep], ms[keep], power, 1.0)
        for b, v in zip(batch[~keep], ms[~keep]):
            # a batch row whose longer lengths were not measured is extrapolated, not interpolated: skip it
            if held < length[keep & (batch == b)].max():
                errors.append(abs(table.ms(int(b), int(held)) / v - 1))
    return errors


def head_shape_errors(gpu: str, kind: str, kv_dtype: str = "bfloat16") -> list[float]:
    """Leave out each measured (num_heads, num_kv_heads) at head_dim 128 in turn; predict its rows from the nearest
    remaining head shape, scaled as the cost model scales it (decode by KV heads, prefill by query heads)."""
    rows = load_tables(gpu).arrays[f"{kind}_{kv_dtype}"].astype(np.float64)
    rows = rows[rows[:, 2] == 128]
    errors: list[float] = []
    for h, kvh in sorted({(int(r[0]), int(r[1])) for r in rows}):
        held = (rows[:, 0] == h) & (rows[:, 1] == kvh)
        table = attention_table(rows[~held], kind, h, kvh, 128)
        for r in rows[held]:
            length = r[4] + r[5] if kind == "decode" else r[4]
            errors.append(abs(table.ms(int(r[3]), int(length)) / r[6] - 1))
    return errors


def p90(errors: list[float]) -> float:
    return float(np.quantile(errors, 0.9))


def summary() -> list[tuple[str, int, float, float, float]]:
    """(what, points, median, 90th percentile and max error) per table and GPU, as the docs table shows them."""
    out = []
    for gpu in ("h100", "h200", "a100"):
        dtypes = ("bfloat16", "fp8") if load_tables(gpu).has_gemm("fp8") else ("bfloat16",)
        for dtype in dtypes:
            for axis in ("m", "n", "k"):
                e = gemm_errors(gpu, dtype, axis)
                out.append((f"{gpu} gemm {dtype}, held-out {axis}", len(e), statistics.median(e), p90(e), max(e)))
        for kind in ("decode", "prefill"):
            e = attention_errors(gpu, kind)
            out.append((f"{gpu} {kind} attention, held-out length", len(e), statistics.median(e), p90(e), max(e)))
            e = head_shape_errors(gpu, kind)
            out.append((f"{gpu} {kind} attention, held-out head shape", len(e), statistics.median(e), p90(e), max(e)))
    return out


if __name__ == "__main__":
    print("| table | points | median error | p90 error | max error |\n|---|---|---|---|---|")
    for what, count, med, high, worst in summary():
        print(f"| {what} | {count} | {med:.1%} | {high:.1%} | {worst:.1%} |")
