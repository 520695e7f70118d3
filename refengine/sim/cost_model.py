"""The simulated GPU's cost of one engine step: every formula and constant of the simulation, with its source.

A step's time is the forward of the tokens the scheduler picked, read off kernel latencies measured under vLLM
(refengine/sim/kernel_tables.py), plus the host's work:

    gpu = num_layers * (gemm(qkv) + gemm(o) + gemm(gate_up) + gemm(down)        at M = scheduled tokens
                        + decode_attention(decoding requests, their mean KV length)
                        + prefill_attention(prefill chunks, their causal work)
                        + non_gemm(M))                                          norms, rope, KV write, activation
          + gemm(lm_head) at M = sampling rows + sampler(sampling rows)
    cpu = HOST.step_s + HOST.per_request_s * scheduled requests
    step = max(cpu, gpu) under async scheduling (the host prepares step N+1 while N runs), else cpu + gpu

Where a table has no entry (a head size or dtype it did not measure) the roofline stands in:
max(flops / (peak * ROOFLINE_FLOPS_EFF), bytes / (hbm * ROOFLINE_HBM_EFF)) + KERNEL_FLOOR_S.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from refengine.sim.gpus import GpuSpec, get_gpu
from refengine.sim.kernel_tables import KernelTables, load_tables

COST_MODEL_VERSION = "sim-1 (aiconfigurator-core 0.12.0 vllm 0.24.0 tables; a100: vllm 0.14.0)"
DTYPES = ("bfloat16", "fp8")
DTYPE_BYTES = {"bfloat16": 2, "fp8": 1}
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
# the sampler reads the float32 logits a few times (temperature, softmax / argmax, the sampled-token gather)
SAMPLER_LOGIT_PASSES = 3


@dataclass(frozen=True)
class HostCost:
    """The CPU's share of a step: fixed work per step plus work per scheduled request."""

    step_s: float
    per_request_s: float

    def seconds(self, num_requests: int) -> float:
        return self.step_s + self.per_request_s * num_requests


# refengine's own host time per decode step: `cbbench bench-step --stub-model` lowest medians 0.57 ms at 64 and
# 1.68 ms at 256 running requests (README, "Host time per step"): 5.8 us per request and 0.2 ms per step
DEFAULT_HOST = HostCost(step_s=0.2e-3, per_request_s=5.8e-6)


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True  # Llama / Qwen2 / Mistral: gate_up + down; OPT: fc1 + fc2
    tie_word_embeddings: bool = False  # the embedding doubles as lm_head (no second copy in memory)
    extra_params: int = 0  # kept in bf16 beside the linears: biases (Qwen2's qkv, all of OPT's), learned positions

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}")

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelShape:
        """From a Hugging Face config.json (Llama, Qwen2, Mistral or OPT)."""
        is_opt = cfg.get("model_type") == "opt"
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg["ffn_dim"] if is_opt else cfg["intermediate_size"])
        extra = 0
        if cfg.get("model_type") == "qwen2":  # q, k and v projections carry biases
            extra = layers * (heads + 2 * kv_heads) * head_dim
        elif is_opt:  # biases of q, k, v, o, fc1, fc2 and both LayerNorms; learned positions (offset by 2)
            positions = int(cfg.get("max_position_embeddings", 2048)) + 2
            extra = layers * (7 * hidden + inter) + hidden + positions * hidden
        return cls(
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=inter,
            vocab_size=int(cfg["vocab_size"]),
            gated_mlp=not is_opt,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", is_opt)),
            extra_params=extra,
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(n, k) of each per-layer GEMM, y[M, n] = x[M, k] @ W[k, n]."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        up = (2 if self.gated_mlp else 1) * self.intermediate_size
        return {
            "qkv": (q + 2 * kv, self.hidden_size),
            "o": (self.hidden_size, q),
            "gate_up": (up, self.hidden_size),
            "down": (self.hidden_size, self.intermediate_size),
        }

    def weight_bytes(self, dtype: str) -> int:
        """Bytes of weights on the device; fp8 checkpoints keep the embedding and lm_head in bf16, as vLLM loads
        them (ModelOpt and compressed-tensors FP8 quantise the decoder linears only)."""
        _check_dtype(dtype)
        linear = sum(n * k for n, k in self.linear_shapes().values()) * self.num_layers
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return linear * DTYPE_BYTES[dtype] + (embeddings + norms + self.extra_params) * 2

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V of every layer for one token; dtype "fp8" also means an fp8 KV cache (an assumption: NVIDIA's
        FP8 checkpoints ship fp8 KV scales, and vLLM uses them with kv_cache_dtype=fp8)."""
        _check_dtype(dtype)
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * DTYPE_BYTES[dtype]


@dataclass(frozen=True)
class StepShape:
    new_tokens: tuple[int, ...]  # per scheduled request: tokens scheduled this step
    context_tokens: tuple[int, ...]  # per scheduled request: num_computed_tokens before this step
    num_sampling_rows: int  # rows that sample (lm_head M)


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not simulated; use one of {', '.join(DTYPES)}")


class CostModel:
    """Seconds per engine step on a simulated GPU, from the step's shape alone; lookups are cached per shape."""

    def __init__(
        self,
        gpu: str | GpuSpec,
        shape: ModelShape,
        dtype: str = "bfloat16",
        async_scheduling: bool = False,
        host_seconds: HostCost | None = None,
    ) -> None:
        _check_dtype(dtype)
        self.gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
        peak = self.gpu.fp8_flops if dtype == "fp8" else self.gpu.bf16_flops
        if peak <= 0:
            raise ValueError(f"dtype: {self.gpu.name} has no {dtype} tensor cores")
        self.shape, self.dtype, self.async_scheduling = shape, dtype, async_scheduling
        self.host = host_seconds or DEFAULT_HOST
        self._hbm = self.gpu.hbm_bytes_per_s * ROOFLINE_HBM_EFF
        try:
            tables = load_tables(self.gpu.name)
        except FileNotFoundError:  # a GpuSpec of the caller's own, with no measured tables: roofline only
            tables = None
        self.version = COST_MODEL_VERSION if tables else COST_MODEL_VERSION + " roofline-only"
        self._gemms = [
            (self._gemm_fn(tables, dtype, n, k, DTYPE_BYTES[dtype])) for n, k in shape.linear_shapes().values()
        ]
        # vLLM keeps lm_head in bf16 in fp8 checkpoints
        self._lm_head = self._gemm_fn(tables, "bfloat16", shape.vocab_size, shape.hidden_size, 2)
        self._by_tokens: dict[int, tuple[float, float]] = {}  # M -> (gemm, non_gemm) over all layers
        self._by_rows: dict[int, float] = {}  # sampling rows -> lm_head + sampler
        h, kvh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
        self._decode = tables.attention("decode", dtype, h, kvh, d) if tables else None
        self._prefill = tables.attention("prefill", dtype, h, kvh, d) if tables else None
        self._kv_bytes_per_layer = shape.kv_bytes_per_token(dtype) / shape.num_layers
        act = (
            8 * shape.hidden_size
            + 2 * (h + kvh) * d
            + 4 * kvh * d
            + (3 if shape.gated_mlp else 2) * shape.intermediate_size
        )
        self._non_gemm_bytes_per_token = 2 * act  # bf16 activations, each read or written once per pass

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
        flops = 2 * self.shape.num_heads * self.shape.head_dim * work  # QK^T and PV over the causal triangle
        return flops / (self.gpu.bf16_flops * ROOFLINE_FLOPS_EFF) + KERNEL_FLOOR_S

    def breakdown(self, step: StepShape) -> dict[str, float]:
        """Seconds per term: gemm, decode_attention, prefill_attention, non_gemm, lm_head (all layers), then
        gpu (their sum), cpu, and step (what step_seconds returns)."""
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
        out = dict.fromkeys(("gemm", "decode_attention", "prefill_attention", "non_gemm", "lm_head"), 0.0)
        if tokens:
            per_m = self._by_tokens.get(tokens)
            if per_m is None:
                per_m = self._by_tokens[tokens] = (
                    layers * sum(fn(tokens) for fn in self._gemms),
                    layers
                    * (
                        NON_GEMM_KERNELS_PER_LAYER * KERNEL_FLOOR_S
                        + tokens * self._non_gemm_bytes_per_token / self._hbm
                    ),
                )
            out["gemm"], out["non_gemm"] = per_m
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
                head = self._by_rows[rows] = self._lm_head(rows) + sampler
            out["lm_head"] = head
        gpu = sum(out.values())
        cpu = self.host.seconds(len(step.new_tokens))
        out.update(gpu=gpu, cpu=cpu, step=max(cpu, gpu) if self.async_scheduling else cpu + gpu)
        return out

    def step_seconds(self, step: StepShape) -> float:
        """GPU time plus the host's; under async scheduling the larger of the two."""
        return self.breakdown(step)["step"]
