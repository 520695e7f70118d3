"""The decoder: Llama / Qwen2 / Mistral-family causal LM over a paged KV cache.

Owns `ModelConfig` (the architecture, frozen and validated) and `CausalLM`. Parameter names are exactly
Hugging Face's (`model.layers.{i}.self_attn.q_proj.weight`, ...) so an HF state dict loads without renaming.

One forward takes the flat token batch of a step: every scheduled token of every sequence, prefill chunks and
decodes mixed, concatenated in `query_start_loc` order. Each attention layer writes this step's K/V into the
paged cache first (`reshape_and_cache`) and then attends over the cache (`unified_attention`), so a token sees
both the KV cached by earlier steps and the KV of earlier tokens of its own chunk.

The arithmetic follows transformers' modeling_llama / modeling_qwen2 op for op (RMSNorm in float32, cos/sin in
float32 then cast, rotate-half RoPE, residual order), so float32 logits agree with HF's to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from refengine.attention import AttentionBackend, AttentionMetadata

ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3.1 RoPE scaling (`rope_type: "llama3"`), the only scaling supported; others fail at load."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self) -> None:
        if self.rope_type != "llama3":
            raise ValueError(f"rope_scaling.rope_type {self.rope_type!r} is not supported (only 'llama3')")
        if self.factor <= 0 or self.low_freq_factor <= 0 or self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(f"rope_scaling: need factor > 0 and high_freq_factor > low_freq_factor > 0, got {self}")
        if self.original_max_position_embeddings <= 0:
            raise ValueError("rope_scaling.original_max_position_embeddings must be positive")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder; HF config.json names. `eos_token_id` is an int, a tuple of ints or None
    (a list is turned into a tuple so the config stays hashable); use `eos_token_ids` to read it."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    architecture: str = "LlamaForCausalLM"
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"ModelConfig.num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"ModelConfig.architecture {self.architecture!r} is not one of {ARCHITECTURES}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling must be a RopeScaling or None, got {self.rope_scaling!r}")
        ids = [("eos_token_id", t) for t in self.eos_token_ids]
        if self.bos_token_id is not None:
            ids.append(("bos_token_id", self.bos_token_id))
        for name, tok in ids:
            if not isinstance(tok, int) or isinstance(tok, bool) or not 0 <= tok < self.vocab_size:
                raise ValueError(f"ModelConfig.{name} {tok!r} is not a token id in [0, {self.vocab_size})")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id, as a tuple (empty when the model has none)."""
        if self.eos_token_id is None:
            return ()
        return (self.eos_token_id,) if isinstance(self.eos_token_id, int) else tuple(self.eos_token_id)

    def replace(self, **changes) -> ModelConfig:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ModelConfig(**values)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies on the CPU, with Llama-3.1 scaling when configured."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim))
    rs = config.rope_scaling
    if rs is None:
        return inv_freq
    # Llama 3.1: long wavelengths (beyond the original context / low_freq_factor) are slowed by `factor`,
    # short ones (below original / high_freq_factor) are kept, and the band between is interpolated linearly.
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor
    high_freq_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rs.factor, inv_freq)
    smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) / (
        rs.high_freq_factor - rs.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(in_band, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Linear(nn.Linear):
    """nn.Linear without torch's initialiser: every weight is written by the loader (a seeded draw or a checkpoint).
    Models are built on the `meta` device, where the initialiser's first call runs torch's Python meta kernels,
    which import torch._dynamo and, through it, Triton: seconds of start-up for values that are overwritten, and
    the torch backend would no longer run without Triton."""

    def reset_parameters(self) -> None:
        pass


class Embedding(nn.Embedding):
    """nn.Embedding without torch's initialiser (see Linear)."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        h, bias = config.hidden_size, config.attention_bias
        self.q_proj = Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)  # [T, H, D]
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)  # [T, kvH, D]
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)  # [T, kvH, D]
        cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, D], broadcast over heads
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_cache, v_cache = kv_cache  # each [num_blocks, block_size, kvH, D]
        self.backend.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)  # [T, H, D]
        self.backend.attend(q, k_cache, v_cache, out, meta, self.scale)
        return self.o_proj(out.view(n, self.num_heads * self.head_dim))  # [T, hidden]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, i, bias=False)
        self.up_proj = Linear(h, i, bias=False)
        self.down_proj = Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [T, hidden]


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.self_attn = Attention(config, backend)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))  # [T, hidden]


class DecoderModel(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        self.model = DecoderModel(config, attn_backend)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        # A plain attribute, not a buffer: `model.to(bfloat16)` must not round the frequencies.
        self._inv_freq = rope_inv_freq(config)  # [D/2] float32, CPU
        self._inv_freq_on: dict[torch.device, torch.Tensor] = {}
        self._lm_head_t: torch.Tensor | None = None  # CPU only: lm_head.weight transposed once (compute_logits)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config ties them (re-run after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._inv_freq_on.get(positions.device)
        if inv_freq is None:
            inv_freq = self._inv_freq_on[positions.device] = self._inv_freq.to(positions.device)
        freqs = positions[:, None].float() * inv_freq  # [T, D/2] float32
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids/positions [T] int64, flat over the step's sequences -> final-norm hidden [T, hidden]."""
        if len(kv_caches) != len(self.model.layers):
            raise ValueError(f"got {len(kv_caches)} kv caches for {len(self.model.layers)} layers")
        x = self.model.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self._rope(positions, x.dtype)  # each [T, D], computed once for every layer
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, cos, sin, kv_cache, attn_metadata)
        return self.model.norm(x)  # [T, hidden]

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [n, hidden] -> float32 logits [n, vocab], written into `out` when given (a float32 [n, vocab]
        buffer the caller reuses: on the CPU a fresh 64 x 151936 result is 39 MB of new pages every step)."""
        if hidden.device.type != "cpu":
            logits = self.lm_head(hidden).float()  # [n, vocab] float32
            return logits if out is None else out.copy_(logits)
        # On the CPU, F.linear picks a slow kernel for a few rows against a vocab-sized weight (measured here with
        # one thread, 151936 x 256: 48 ms for 8 rows, 26 ms as a plain matmul with the weight transposed once).
        # (weights never change after loading; the copy is made at the first step)
        if self._lm_head_t is None:
            self._lm_head_t = self.lm_head.weight.detach().t().contiguous()  # [hidden, vocab]
        if out is None:
            return (hidden @ self._lm_head_t).float()  # [n, vocab] float32
        if hidden.dtype == torch.float32:
            return torch.mm(hidden, self._lm_head_t, out=out)
        return out.copy_(hidden @ self._lm_head_t)
