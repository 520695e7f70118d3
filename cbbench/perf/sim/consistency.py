"""Is a measured run possible at all? A check of a row against the GPU's own measured kernels, before any simulation.

A closed-loop run at concurrency c, each request lasting e2e = TTFT + (osl - 1) x TPOT, completes c / e2e requests
per second. Whatever the scheduler does, every second each GPU of the tensor-parallel group must then at least:
- run its share of the decoder linears over every token, isl + osl per request (2 x linear parameters FLOPs per
  token), at no more than the fastest rate the GEMM tables measured for the model's per-GPU shapes;
- run causal prefill attention over each prompt (4 x heads x head_dim x isl^2 / 2 FLOPs per layer), at no more than
  the fastest rate the prefill-attention table measured;
- read the KV cache once per generated token (a decode attends over its whole context, isl + osl / 2 on average),
  at no more than the GPU's peak HBM bandwidth; the KV is taken at its smallest plausible size (fp8 for an fp8
  model), so the bound is lenient.
The sum of those times per second is a lower bound on the GPU's busy fraction. A row that needs more than 1.0 did
not hold what it reports (fewer requests in flight than c, shorter or shared prompts, another protocol): it is
self-inconsistent, kept in the tables with that flag and its number, and reported both in and out of the medians.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cbbench.perf.sim.measured import MeasuredRun
from refengine.sim.gpus import get_gpu
from refengine.sim.kernel_tables import load_tables
from refengine.sim.model_shape import ModelShape


@dataclass(frozen=True)
class Feasibility:
    gemm: float  # busy fraction of one GPU for the decoder linears, at the tables' fastest rate
    attention: float  # ... for prefill attention, at the prefill table's fastest rate
    kv_read: float  # ... for reading the KV cache, at peak HBM bandwidth

    @property
    def busy(self) -> float:
        return self.gemm + self.attention + self.kv_read

    @property
    def consistent(self) -> bool:
        return self.busy <= 1.0


@functools.cache
def best_gemm_flops(gpu: str, dtype: str, shape: ModelShape, tp: int) -> float:
    """The highest FLOP/s of the model's four per-GPU decoder GEMMs run together, over every measured row count."""
    tables = load_tables(gpu)
    curves = [tables.gemm(dtype, n, k) for n, k in shape.linear_shapes(tp).values()]
    if any(c is None for c in curves):
        raise ValueError(f"{gpu} has no {dtype} GEMM table for these shapes")
    flops_per_row = 2 * sum(n * k for n, k in shape.linear_shapes(tp).values())
    rows = np.exp(tables.gemm_grid(dtype).log_m).round().astype(int)
    return max(int(m) * flops_per_row / (sum(c.ms(int(m)) for c in curves if c) * 1e-3) for m in rows)


@functools.cache
def best_prefill_attention_flops(gpu: str, dtype: str, head_dim: int) -> float:
    """The highest causal-attention FLOP/s any measured prefill call reached on this GPU (any head shape)."""
    rows = load_tables(gpu).arrays[f"prefill_{dtype}"]
    rows = rows[rows[:, 2] == head_dim].astype(np.float64)
    h, d, b, isl, ms = rows[:, 0], rows[:, 2], rows[:, 3], rows[:, 4], rows[:, 6]
    return float(np.max(4 * h * d * b * isl * isl / 2 / (ms * 1e-3)))


def feasibility(run: MeasuredRun, shape: ModelShape) -> Feasibility | None:
    """None for a run whose figures do not pin its load (no concurrency, lengths or latencies)."""
    if None in (run.concurrency, run.isl, run.osl, run.ttft_ms, run.tpot_ms):
        return None
    assert run.concurrency and run.isl and run.osl and run.ttft_ms is not None and run.tpot_ms is not None
    tp, isl, osl = run.tensor_parallel_size, run.isl, run.osl
    req_per_s = run.concurrency / ((run.ttft_ms + (osl - 1) * run.tpot_ms) / 1e3)
    linear = 2 * sum(n * k for n, k in shape.linear_shapes(tp).values()) * shape.num_layers
    gemm = req_per_s * (isl + osl) * linear / best_gemm_flops(run.gpu, run.dtype, shape, tp)
    heads = shape.num_heads // tp
    attn_flops = 4 * heads * shape.head_dim * isl * isl / 2 * shape.num_layers
    attention = req_per_s * attn_flops / best_prefill_attention_flops(run.gpu, run.dtype, shape.head_dim)
    kv_dtype = "fp8" if run.dtype == "fp8" else "bfloat16"
    kv_bytes = req_per_s * osl * (isl + osl / 2) * shape.kv_bytes_per_token(kv_dtype, tp)
    return Feasibility(gemm, attention, kv_bytes / get_gpu(run.gpu).hbm_bytes_per_s)
