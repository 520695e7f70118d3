"""ModelShape: what the cost model needs of a model, and what one GPU of a tensor-parallel group holds of it.

Tensor parallelism splits the model as vLLM's Megatron-style layers do (vllm/model_executor/layers/linear.py):
- qkv and gate_up are column-parallel: each GPU computes num_heads / tp query heads, its KV heads and
  intermediate / tp of the MLP; o and down are row-parallel (k / tp) and end in an all-reduce of the hidden state.
- KV heads: num_kv_heads / tp per GPU; when tp > num_kv_heads each GPU keeps one KV head, replicated
  (tp % num_kv_heads == 0 is required then, as vLLM requires).
- The embedding and lm_head are vocabulary-parallel (vocab / tp rows per GPU); the norms are replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPES = ("bfloat16", "fp8")
DTYPE_BYTES = {"bfloat16": 2, "fp8": 1}
# the tensor-parallel degrees the all-reduce tables measure (aiconfigurator-core's vLLM collectives: 2, 4, 8 GPUs)
SIMULATED_TP = (1, 2, 4, 8)


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype: {dtype!r} is not simulated; use one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool = True  # Llama / Qwen / Mistral: gate_up + down; OPT: fc1 + fc2
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
        """From a Hugging Face config.json (Llama, Qwen2, Qwen3, Mistral or OPT)."""
        kind = cfg.get("model_type")
        is_opt = kind == "opt"
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        inter = int(cfg["ffn_dim"] if is_opt else cfg["intermediate_size"])
        extra = 0
        if kind == "qwen2":  # q, k and v projections carry biases
            extra = layers * (heads + 2 * kv_heads) * head_dim
        elif kind == "qwen3":  # an RMSNorm over each query and key head (q_norm, k_norm)
            extra = layers * 2 * head_dim
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

    def check_tp(self, tp: int) -> None:
        """ValueError naming tensor_parallel_size unless this model splits over `tp` GPUs as vLLM splits it."""
        if tp not in SIMULATED_TP:
            raise ValueError(
                f"tensor_parallel_size={tp}: not simulated; use one of {', '.join(map(str, SIMULATED_TP))} "
                "(the sizes the measured all-reduce tables cover)"
            )
        if self.num_heads % tp:
            raise ValueError(f"tensor_parallel_size={tp} does not divide the model's {self.num_heads} attention heads")
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size={tp}: the model's {self.num_kv_heads} KV heads neither divide among nor "
                "replicate over that many GPUs"
            )

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        return max(self.num_kv_heads // tp, 1)

    def linear_shapes(self, tp: int = 1) -> dict[str, tuple[int, int]]:
        """(n, k) of each per-layer GEMM on one GPU of `tp`, y[M, n] = x[M, k] @ W[k, n]."""
        q = self.num_heads // tp * self.head_dim
        kv = self.kv_heads_per_gpu(tp) * self.head_dim
        up = (2 if self.gated_mlp else 1) * self.intermediate_size // tp
        return {
            "qkv": (q + 2 * kv, self.hidden_size),
            "o": (self.hidden_size, q),
            "gate_up": (up, self.hidden_size),
            "down": (self.hidden_size, self.intermediate_size // tp),
        }

    def weight_bytes(self, dtype: str, tp: int = 1) -> int:
        """Bytes of weights on one GPU of `tp`; fp8 checkpoints keep the embedding and lm_head in bf16, as vLLM
        loads them (ModelOpt and compressed-tensors FP8 quantise the decoder linears only)."""
        check_dtype(dtype)
        linear = sum(n * k for n, k in self.linear_shapes(tp).values()) * self.num_layers
        embeddings = -(-self.vocab_size // tp) * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return linear * DTYPE_BYTES[dtype] + (embeddings + norms + self.extra_params) * 2

    def kv_bytes_per_token(self, dtype: str, tp: int = 1) -> int:
        """K and V of every layer for one token, on one GPU of `tp`."""
        check_dtype(dtype)
        return 2 * self.num_layers * self.kv_heads_per_gpu(tp) * self.head_dim * DTYPE_BYTES[dtype]
