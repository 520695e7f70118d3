"""The simulated GPU's cost of one engine step: every formula and constant of the simulation, with its source.

A step's time is the forward of the tokens the scheduler picked, read off kernel latencies measured under vLLM
(refengine/sim/kernel_tables.py), plus the host's work:

    gpu = num_layers * (gemm(qkv) + gemm(o) + gemm(gate_up) + gemm(down)        at M = scheduled tokens
                        + decode_attention(decoding requests, their mean KV length)
                        + prefill_attention(prefill chunks, their causal work)
                        + non_gemm(M))                                          norms, rope, KV write, activation
          + (2 * num_layers + 1) * all_reduce(M x hidden)                       tensor parallel only
          + gemm(lm_head) at M = sampling rows (+ logits all-gather) + sampler(sampling rows)

With tensor_parallel_size = tp every shape is one GPU's share (refengine/sim/model_shape.py): the GEMMs, attention
heads, KV and lm_head split over tp GPUs that run at once, joined by vLLM's all-reduce (refengine/sim/comm.py).
    cpu = HOST.step_s + HOST.per_request_s * scheduled requests
    step = max(cpu, gpu) under async scheduling (the host prepares step N+1 while N runs), else cpu + gpu

Where a table has no entry (a head size or dtype it did not measure) the roofline stands in:
max(flops / (peak * ROOFLINE_FLOPS_EFF), bytes / (hbm * ROOFLINE_HBM_EFF)) + KERNEL_FLOOR_S.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from refengine.sim.comm import CollectiveCurve, collective
from refengine.sim.gpus import GpuSpec, get_gpu
from refengine.sim.kernel_tables import KernelTables, load_tables
from refengine.sim.model_shape import DTYPE_BYTES, KV_CACHE_DTYPE, ModelShape, check_dtype

COST_MODEL_VERSION = "sim-2 (aiconfigurator-core 0.12.0 vllm 0.24.0 tables; a100: vllm 0.14.0)"
# aiconfigurator-core's own constants for memory-bound ops (data/<gpu>_system.yaml: mem_bw_empirical_scaling_factor
# 0.8, mem_empirical_constant_latency 3 us); reused for the roofline fallback and the non-GEMM term
ROOFLINE_HBM_EFF = 0.8
KERNEL_FLOOR_S = 3e-6
# the share of the tensor-core peak the measured tables reach on Llama-3.1-8B's four linears at M = 1024 and 8192:
# h100 bf16 0.81 / 0.75, h100 fp8 0.56 / 0.58, a100 bf16 0.82 / 0.84
ROOFLINE_FLOPS_EFF = 0.7
# per layer outside the GEMMs and attention: fused add+RMSNorm twice, rotary embedding, the KV cache write and
# SiLU-and-mul; five kernels, each at least KERNEL_FLOOR_S (vLLM runs decode in CUDA graphs, so no launch gap)
NON_GEMM_KERNELS_PER_LAYER = 5
# Qwen3 adds a per-head RMSNorm of the queries and of the keys before RoPE (q_norm, k_norm): two kernels more
QK_NORM_KERNELS = 2
# the sampler reads the float32 logits a few times (temperature, softmax / argmax, the sampled-token gather)
SAMPLER_LOGIT_PASSES = 3
# vLLM captures CUDA graphs for steps of up to 512 tokens (its default cudagraph capture sizes end at 512); a
# larger step runs eagerly, which the all-reduce tables measure separately
CUDA_GRAPH_MAX_TOKENS = 512


@dataclass(frozen=True)
class HostCost:
    """The CPU's share of a step: fixed work per step plus work per scheduled request."""

    step_s: float
    per_request_s: float

    def seconds(self, num_requests: int) -> float:
        return self.step_s + self.per_request_s * num_requests


# refengine's own host time per decode step (schedule, input preparation, update_from_output, outputs: the CPU work
# a GPU's asynchronous forward does not hide), as a fixed part plus a part per running request: a line through
# `cbbench bench-step --stub-model`'s lowest medians at 64 and 256 running requests (the figures: docs/perf.md,
# "Host time per step"; the constant: docs/simulation.md)
DEFAULT_HOST = HostCost(step_s=0.2e-3, per_request_s=5.8e-6)


@dataclass(frozen=True)
class StepShape:
    new_tokens: tuple[int, ...]  # per scheduled request: tokens scheduled this step
    context_tokens: tuple[int, ...]  # per scheduled request: num_computed_tokens before this step
    num_sampling_rows: int  # rows that sample (lm_head M)


class CostModel:
    """Seconds per engine step on a simulated GPU, from the step's shape alone; lookups are cached per shape."""

    def __init__(
        self,
        gpu: str | GpuSpec,
        shape: ModelShape,
        dtype: str = "bfloat16",
        async_scheduling: bool = False,
        host_seconds: HostCost | None = None,
        tensor_parallel_size: int = 1,
    ) -> None:
        check_dtype(dtype)
        shape.check_tp(tensor_parallel_size)
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        peak = self.gpu.fp8_flops if dtype == "fp8" else self.gpu.bf16_flops
        if peak <= 0:
            raise ValueError(f"dtype: {self.gpu.name} has no {dtype} tensor cores")
        self.shape, self.dtype, self.async_scheduling = shape, dtype, async_scheduling
        self.tp = tp = tensor_parallel_size
        self.host = host_seconds or DEFAULT_HOST
        self._hbm = self.gpu.hbm_bytes_per_s * ROOFLINE_HBM_EFF
        try:
            tables = load_tables(self.gpu.name)
        except FileNotFoundError:  # a GpuSpec of the caller's own, with no measured tables: roofline only
            tables = None
        self.version = COST_MODEL_VERSION if tables else COST_MODEL_VERSION + " roofline-only"
        # every GPU of the group runs the same per-GPU shapes at once: one GPU's time is the step's
        self._gemms = [
            (self._gemm_fn(tables, dtype, n, k, DTYPE_BYTES[dtype])) for n, k in shape.linear_shapes(tp).values()
        ]
        # vLLM keeps lm_head in bf16 in fp8 checkpoints; vocabulary-parallel: vocab / tp rows per GPU
        self._lm_head = self._gemm_fn(tables, "bfloat16", -(-shape.vocab_size // tp), shape.hidden_size, 2)
        self._by_tokens: dict[int, tuple[float, float, float]] = {}  # M -> (gemm, non_gemm, all-reduce), all layers
        self._by_rows: dict[int, float] = {}  # sampling rows -> lm_head + sampler (+ the logits all-gather)
        h, kvh, d = shape.num_heads // tp, shape.kv_heads_per_gpu(tp), shape.head_dim
        # attention reads and writes the KV cache in its own dtype (KV_CACHE_DTYPE), whatever the weights' dtype
        self._decode = tables.attention("decode", KV_CACHE_DTYPE, h, kvh, d) if tables else None
        self._prefill = tables.attention("prefill", KV_CACHE_DTYPE, h, kvh, d) if tables else None
        self._heads = h
        self._kv_bytes_per_layer = shape.kv_bytes_per_token(KV_CACHE_DTYPE, tp) / shape.num_layers
        self._non_gemm_kernels = NON_GEMM_KERNELS_PER_LAYER + (QK_NORM_KERNELS if shape.qk_norm else 0)
        act = (
            8 * shape.hidden_size
            + 2 * (h + kvh) * d
            + 4 * kvh * d
            + (3 if shape.gated_mlp else 2) * shape.intermediate_size // tp
        )
        self._non_gemm_bytes_per_token = 2 * act  # bf16 activations, each read or written once per pass
        self._allreduce: tuple[CollectiveCurve, CollectiveCurve] | None = None
        self._allgather: CollectiveCurve | None = None
        if tp > 1:
            arrays = tables.arrays if tables else {}
            graph, eager = collective(arrays, "allreduce_graph", tp), collective(arrays, "allreduce_eager", tp)
            if graph is None or eager is None:
                raise ValueError(f"tensor_parallel_size={tp}: {self.gpu.name} has no measured all-reduce tables")
            self._allreduce, self._allgather = (graph, eager), collective(arrays, "allgather", tp)

    def _allreduce_s(self, tokens: int) -> float:
        """All-reduces of one step over all layers: two per layer (after o and after down, the row-parallel
        GEMMs) and one after the vocabulary-parallel embedding, each of tokens x hidden bf16 elements. A step of up
        to CUDA_GRAPH_MAX_TOKENS tokens replays a CUDA graph; a larger one runs eagerly."""
        if self._allreduce is None:
            return 0.0
        graph, eager = self._allreduce
        curve = graph if tokens <= CUDA_GRAPH_MAX_TOKENS else eager
        return (2 * self.shape.num_layers + 1) * curve.seconds(tokens * self.shape.hidden_size)

    def _gemm_fn(
        self, tables: KernelTables | None, dtype: str, n: int, k: int, weight_bytes: int
    ) -> Callable[[int], float]:
        """Seconds of the GEMM y[M, n] = x[M, k] @ W[k, n] as a function of M: the table, else the roofline."""
        curve = tables.gemm(dtype, n, k) if tables is not None and tables.has_gemm(dtype) else None
        if curve is not None:
            return lambda m: curve.ms(m) * 1e-3
        peak = self.gpu.fp8_flops if dtype == "fp8" else self.gpu.bf16_flops
        hbm = self.gpu.hbm_bytes_per_s * ROOFLINE_HBM_EFF
        return lambda m: (
            max(2 * m * n * k / (peak * ROOFLINE_FLOPS_EFF), (n * k * weight_bytes + 2 * m * (n + k)) / hbm)
            + KERNEL_FLOOR_S
        )

    def _decode_s(self, batch: int, kv_len: int) -> float:
        if self._decode is not None:
            return self._decode.ms(batch, kv_len) * 1e-3
        return batch * kv_len * self._kv_bytes_per_layer / self._hbm + KERNEL_FLOOR_S

    def _prefill_s(self, chunks: int, isl: int, work: float) -> float:
        if self._prefill is not None:
            return self._prefill.ms(chunks, isl) * 1e-3
        flops = 2 * self._heads * self.shape.head_dim * work  # QK^T and PV over the causal triangle
        return flops / (self.gpu.bf16_flops * ROOFLINE_FLOPS_EFF) + KERNEL_FLOOR_S

    def breakdown(self, step: StepShape) -> dict[str, float]:
        """Seconds per term: gemm, decode_attention, prefill_attention, non_gemm, communication (the
        tensor-parallel all-reduces), lm_head (all layers), then gpu (their sum), cpu, and step (what step_seconds
        returns)."""
        new, ctx = step.new_tokens, step.context_tokens
        tokens = sum(new)
        # a request with one new token decodes (a one-token prompt too: attention over one key either way); the
        # rest are prefill chunks, few per step, so only they are looped over (this runs once per engine step)
        chunks = [] if new.count(1) == len(new) else [i for i, q in enumerate(new) if q != 1]
        n_dec = len(new) - len(chunks)
        dec_kv = sum(ctx) - sum(ctx[i] for i in chunks) + n_dec  # each decode attends over c + 1 keys
        n_pre = pre_work = 0  # pre_work: sum over chunks of q * (2c + q), twice the causal query-key pairs
        for i in chunks:
            q = new[i]
            if q > 0:
                n_pre += 1
                pre_work += q * (2 * ctx[i] + q)
        layers = self.shape.num_layers
        out = dict.fromkeys(
            ("gemm", "decode_attention", "prefill_attention", "non_gemm", "communication", "lm_head"), 0.0
        )
        if tokens:
            per_m = self._by_tokens.get(tokens)
            if per_m is None:
                per_m = self._by_tokens[tokens] = (
                    layers * sum(fn(tokens) for fn in self._gemms),
                    layers
                    * (self._non_gemm_kernels * KERNEL_FLOOR_S + tokens * self._non_gemm_bytes_per_token / self._hbm),
                    self._allreduce_s(tokens),
                )
            out["gemm"], out["non_gemm"], out["communication"] = per_m
        if n_dec:
            out["decode_attention"] = layers * self._decode_s(n_dec, round(dec_kv / n_dec))
        if n_pre:
            isl = max(1, round(math.sqrt(pre_work / n_pre)))  # the prompt length with the same causal work
            out["prefill_attention"] = layers * self._prefill_s(n_pre, isl, pre_work / 2)
        rows = step.num_sampling_rows
        if rows:
            head = self._by_rows.get(rows)
            if head is None:
                sampler = rows * self.shape.vocab_size * 4 * SAMPLER_LOGIT_PASSES / self._hbm + KERNEL_FLOOR_S
                gather = self._allgather.seconds(rows * self.shape.vocab_size) if self._allgather else 0.0
                head = self._by_rows[rows] = self._lm_head(rows) + gather + sampler
            out["lm_head"] = head
        gpu = sum(out.values())
        cpu = self.host.seconds(len(step.new_tokens))
        out.update(gpu=gpu, cpu=cpu, step=max(cpu, gpu) if self.async_scheduling else cpu + gpu)
        return out

    def step_seconds(self, step: StepShape) -> float:
        """GPU time plus the host's; under async scheduling the larger of the two."""
        return self.breakdown(step)["step"]
