"""Seconds per engine step on a simulated GPU, from the step's shape alone.

# placeholder: replaced by the measured-table model (a roofline with flat efficiencies, enough to drive the engine)
"""
from __future__ import annotations

from dataclasses import dataclass

COST_MODEL_VERSION = "roofline-placeholder-0"
_BYTES = {"bfloat16": 2, "fp8": 1}
FLOPS_EFFICIENCY = 0.6  # placeholder guess of achieved / peak tensor throughput
HBM_EFFICIENCY = 0.8  # placeholder guess of achieved / peak bandwidth
LAYER_OVERHEAD_S = 10e-6  # placeholder: norms, rotary, activation kernels per layer
HOST_STEP_S = 1e-3  # placeholder host time per step ...
HOST_PER_REQUEST_S = 5e-6  # ... and per scheduled request


def _elem(dtype: str) -> int:
    if dtype not in _BYTES:
        raise ValueError(f"dtype must be one of {sorted(_BYTES)}, got {dtype!r}")
    return _BYTES[dtype]


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelShape":
        if cfg.get("model_type") == "opt":  # OPT: fc1/fc2 (two GEMMs of ffn_dim) ~ three of 2/3 ffn_dim
            h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
            return cls(cfg["num_hidden_layers"], h, heads, heads, h // heads, cfg["ffn_dim"] * 2 // 3,
                       cfg["vocab_size"])
        heads = cfg["num_attention_heads"]
        return cls(cfg["num_hidden_layers"], cfg["hidden_size"], heads, cfg.get("num_key_value_heads") or heads,
                   cfg.get("head_dim") or cfg["hidden_size"] // heads, cfg["intermediate_size"], cfg["vocab_size"])

    def layer_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        return h * d * (2 * self.num_heads + 2 * self.num_kv_heads) + 3 * h * self.intermediate_size

    def weight_bytes(self, dtype: str) -> int:
        return (self.num_layers * self.layer_params() + 2 * self.vocab_size * self.hidden_size) * _elem(dtype)

    def kv_bytes_per_token(self, dtype: str) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * _elem(dtype)


@dataclass(frozen=True)
class StepShape:
    new_tokens: tuple[int, ...]  # per scheduled request: tokens computed this step
    context_tokens: tuple[int, ...]  # per scheduled request: tokens already in its KV cache before this step
    num_sampling_rows: int


class CostModel:
    def __init__(self, gpu, shape: ModelShape, dtype: str = "bfloat16", async_scheduling: bool = False,
                 host_seconds=None) -> None:
        _elem(dtype)
        self.gpu, self.shape, self.dtype, self.async_scheduling = gpu, shape, dtype, async_scheduling
        self.host_seconds = host_seconds
        self._flops = (gpu.fp8_flops if dtype == "fp8" else gpu.bf16_flops) * FLOPS_EFFICIENCY
        self._bw = gpu.hbm_bytes_per_s * HBM_EFFICIENCY
        self._weights = shape.weight_bytes(dtype) - shape.vocab_size * shape.hidden_size * _elem(dtype)
        self._kv = shape.kv_bytes_per_token("bfloat16")

    def breakdown(self, step: StepShape) -> dict[str, float]:
        s = self.shape
        tokens = sum(step.new_tokens)
        attn_pairs = sum(n * (c + n) for n, c in zip(step.new_tokens, step.context_tokens))
        kv_read = sum(step.context_tokens) + tokens
        flops = 2 * tokens * s.num_layers * s.layer_params() + 4 * s.num_layers * s.num_heads * s.head_dim * attn_pairs
        flops += 2 * step.num_sampling_rows * s.vocab_size * s.hidden_size
        nbytes = self._weights + kv_read * self._kv
        gpu = max(flops / self._flops, nbytes / self._bw) + s.num_layers * LAYER_OVERHEAD_S if tokens else 0.0
        host = (self.host_seconds(step) if callable(self.host_seconds) else self.host_seconds
                if self.host_seconds is not None else HOST_STEP_S + HOST_PER_REQUEST_S * len(step.new_tokens))
        return {"gpu": gpu, "host": host, "total": max(gpu, host) if self.async_scheduling else gpu + host}

    def step_seconds(self, step: StepShape) -> float:
        return self.breakdown(step)["total"]
