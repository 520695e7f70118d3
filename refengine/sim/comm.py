"""Collective communication of a tensor-parallel group, from measured tables (data/<gpu>.npz, ci/extract_sim_tables.py).

- All-reduce: vLLM's own `tensor_model_parallel_all_reduce` (its custom all-reduce for small messages, NCCL beyond)
  measured by aiconfigurator-core 0.12.0 under vLLM 0.24.0 (a100: 0.14.0) at 2, 4 and 8 GPUs over bf16 messages of
  128 to 2^29 elements, twice: replayed in a CUDA graph (a decode or small mixed step) and called eagerly (a step too
  large for vLLM's CUDA graphs).
- All-gather: NCCL's (half), for the logits of a vocabulary-parallel lm_head.
Latency is interpolated in log size; below the smallest message it is the smallest's, above the largest it grows
linearly with size (bandwidth-bound).
"""

from __future__ import annotations

import math

import numpy as np


class CollectiveCurve:
    """Seconds of one collective over a tp group as a function of the message size in elements."""

    def __init__(self, elements: np.ndarray, ms: np.ndarray) -> None:
        ok = np.isfinite(ms)
        if ok.sum() < 2:
            raise ValueError("a collective table needs at least two measured sizes")
        self._log_n = np.log(elements[ok].astype(np.float64))
        self._log_ms = np.log(ms[ok].astype(np.float64))
        self._cache: dict[int, float] = {}

    def seconds(self, elements: int) -> float:
        hit = self._cache.get(elements)
        if hit is None:
            x = math.log(max(elements, 1))
            if x > self._log_n[-1]:
                log_ms = self._log_ms[-1] + (x - self._log_n[-1])
            else:
                log_ms = float(np.interp(x, self._log_n, self._log_ms))
            hit = math.exp(log_ms) * 1e-3
            if len(self._cache) < 100_000:
                self._cache[elements] = hit
        return hit


def collective(arrays: dict[str, np.ndarray], name: str, tp: int) -> CollectiveCurve | None:
    """`name` is "allreduce_graph", "allreduce_eager" or "allgather"; None when the tables lack it or this tp."""
    kind = "allgather" if name == "allgather" else "allreduce"
    gpus, sizes, ms = (arrays.get(f"{kind}_gpus"), arrays.get(f"{kind}_elements"), arrays.get(f"{name}_ms"))
    if gpus is None or sizes is None or ms is None or tp not in gpus:
        return None
    return CollectiveCurve(sizes, ms[list(gpus).index(tp)])
