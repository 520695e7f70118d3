"""The GEMM floor of a decode step (`cbbench bench-profile`'s last table): the lm_head and MLP GEMMs at M rows,
timed alone in the same thread with the same torch threads, interleaved with real decode steps of the engine at M
running requests (`perf/bench/step.py: make_decoding_engine`)."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F

from cbbench.perf.bench.step import make_decoding_engine
from refengine.models.decoder import CausalLM

if TYPE_CHECKING:
    from refengine.models.decoder import DecoderLayer


def _gemm_floor_s(model: CausalLM, m: int) -> float:
    """CPU seconds of the decode step's GEMMs alone at M = m rows: every layer's MLP (gate_up, down) and the
    lm_head as the model runner computes it (`compute_logits` into a reused float32 buffer), on random activations
    of the model's dtype."""
    cfg = model.config
    x = torch.randn(m, cfg.hidden_size, dtype=model.lm_head.weight.dtype)
    xi = torch.randn(m, cfg.intermediate_size, dtype=x.dtype)
    logits = _floor_logits_buffer(m, cfg.vocab_size)
    t = time.thread_time()
    for layer in cast("list[DecoderLayer]", model.model.layers):  # (torch types a ModuleList's items as Module)
        F.linear(x, layer.mlp.gate_up_proj.weight)
        F.linear(xi, layer.mlp.down_proj.weight)
    model.compute_logits(x, out=logits)
    return time.thread_time() - t


_floor_buffers: dict[tuple[int, int], torch.Tensor] = {}


def _floor_logits_buffer(m: int, vocab: int) -> torch.Tensor:
    """The floor's logits buffer, made once per shape (as the runner's, which outlives its steps)."""
    if (m, vocab) not in _floor_buffers:
        _floor_buffers[(m, vocab)] = torch.empty(m, vocab, dtype=torch.float32)
    return _floor_buffers[(m, vocab)]


def step_vs_floor(num_running: int, iters: int = 20, warmup: int = 3, model: str = "tiny-qwen2") -> dict[str, float]:
    """Median CPU ms of a real decode step at `num_running` (bench_step's engine: short prompts, greedy) and of its
    GEMM floor, measured alternately in this thread, and the ratio of the medians."""

    engine, _ = make_decoding_engine(num_running, iters + warmup, model=model, stub=False)
    lm = engine.model  # (the engine's model module: refengine's CausalLM with stub=False)
    if not isinstance(lm, CausalLM):  # stub=False: refengine's own model (narrows the type for _gemm_floor_s)
        raise RuntimeError(f"bench-profile: the GEMM floor reads refengine's CausalLM, got {type(lm).__name__}")
    steps, floors = [], []
    with torch.inference_mode():
        for i in range(warmup + iters):
            t = time.thread_time()
            engine.step()
            step = time.thread_time() - t
            floor = _gemm_floor_s(lm, num_running)
            if i >= warmup:
                steps.append(step)
                floors.append(floor)
    step_ms, floor_ms = 1e3 * statistics.median(steps), 1e3 * statistics.median(floors)
    return {
        "num_running": num_running,
        "step_ms": step_ms,
        "floor_ms": floor_ms,
        "ratio": step_ms / floor_ms,
        "step_ms_min": 1e3 * min(steps),
        "step_ms_max": 1e3 * max(steps),
        "floor_ms_min": 1e3 * min(floors),
        "floor_ms_max": 1e3 * max(floors),
    }
