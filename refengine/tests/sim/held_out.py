"""Operator-level validation: each interior grid line of a measured table is left out in turn and predicted from
the rest by the same interpolation the cost model uses; the relative errors against the measured values.

Shared by test_kernel_tables.py (which pins them) and docs/simulation.md (whose table they produce:
`python -m refengine.tests.sim.held_out`).
"""

from __future__ import annotations

import statistics

import numpy as np

from refengine.sim.kernel_tables import AttentionTable, GemmCurve, load_tables, make_gemm_grid

# the GEMM region the presets use: every linear of Qwen2.5-0.5B .. OPT-13B has n and k in [512, 65536]
MIN_NK = 512
MAX_M = 8192  # the largest step vLLM schedules by default (max_num_batched_tokens)
# the attention head shape of Llama-3.1-8B (and of most GQA presets): 32 query heads, 8 KV heads, head_dim 128
LLAMA_HEADS = (32, 8, 128)


def gemm_errors(gpu: str, dtype: str, axis: str) -> list[float]:
    """Leave out each interior n (axis="n") or k (axis="k") value; predict every (m, k) or (m, n) at it."""
    tables = load_tables(gpu)
    a = tables._arrays  # the raw grid; the interpolation under test only sees it with one line removed
    m, n, k, ms = (a[f"gemm_{dtype}_{x}"] for x in ("m", "n", "k", "ms"))
    axis_vals = n if axis == "n" else k
    errors: list[float] = []
    for idx in range(1, len(axis_vals) - 1):
        held = int(axis_vals[idx])
        if held < MIN_NK:
            continue
        rest = np.delete(ms, idx, axis=1 if axis == "n" else 2)
        grid = make_gemm_grid(m, np.delete(n, idx) if axis == "n" else n, np.delete(k, idx) if axis == "k" else k,
                              rest)
        for j, other in enumerate(k if axis == "n" else n):
            if other < MIN_NK:
                continue
            curve = GemmCurve(grid, held, int(other)) if axis == "n" else GemmCurve(grid, int(other), held)
            measured = ms[:, idx, j] if axis == "n" else ms[:, j, idx]
            for mi, mv in enumerate(m):
                if mv <= MAX_M and np.isfinite(measured[mi]):
                    errors.append(abs(curve.ms(int(mv)) / float(measured[mi]) - 1))
    return errors


def attention_errors(gpu: str, kind: str, kv_dtype: str = "bfloat16") -> list[float]:
    """Leave out each interior length of the Llama head shape's table; predict it at every batch size."""
    rows = load_tables(gpu)._arrays[f"{kind}_{kv_dtype}"].astype(np.float64)
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


def p90(errors: list[float]) -> float:
    return float(np.quantile(errors, 0.9))


def summary() -> list[tuple[str, int, float, float, float]]:
    """(what, points, median, 90th percentile and max error) per table and GPU, as the docs table shows them."""
    out = []
    for gpu in ("h100", "h200", "a100"):
        dtypes = ("bfloat16", "fp8") if load_tables(gpu).has_gemm("fp8") else ("bfloat16",)
        for dtype in dtypes:
            for axis in ("n", "k"):
                e = gemm_errors(gpu, dtype, axis)
                out.append((f"{gpu} gemm {dtype}, held-out {axis}", len(e), statistics.median(e), p90(e), max(e)))
        for kind in ("decode", "prefill"):
            e = attention_errors(gpu, kind)
            out.append((f"{gpu} {kind} attention, held-out length", len(e), statistics.median(e), p90(e), max(e)))
    return out


if __name__ == "__main__":
    print("| table | points | median error | p90 error | max error |\n|---|---|---|---|---|")
    for what, count, med, high, worst in summary():
        print(f"| {what} | {count} | {med:.1%} | {high:.1%} | {worst:.1%} |")
