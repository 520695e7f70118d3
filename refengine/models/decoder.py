"""The decoder: Llama / Qwen2 / Mistral-family causal LM over a paged KV cache.

Owns `CausalLM` and its modules; the architecture (`ModelConfig`) is refengine.models.model_config's.
Parameter names are exactly Hugging Face's (`model.layers.{i}.self_attn.q_proj.weight`, ...) so an HF state dict
loads without renaming.

One forward takes the flat token batch of a step: every scheduled token of every sequence, prefill chunks and
decodes mixed, concatenated in `query_start_loc` order. Each attention layer writes this step's K/V into the
paged cache first (`reshape_and_cache`) and then attends over the cache (`unified_attention`), so a token sees
both the KV cached by earlier steps and the KV of earlier tokens of its own chunk.

The arithmetic follows transformers' modeling_llama / modeling_qwen2 op for op (RMSNorm in float32, cos/sin in
float32 then cast, rotate-half RoPE, residual order), so float32 logits agree with HF's to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from refengine.layers.attention import AttentionBackend, AttentionMetadata
from refengine.models.model_config import ModelConfig, rope_inv_freq


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
        y: torch.Tensor = self.o_proj(out.view(n, self.num_heads * self.head_dim))  # [T, hidden]
        return y


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, i, bias=False)
        self.up_proj = Linear(h, i, bias=False)
        self.down_proj = Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [T, hidden]
        return y


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
        y: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))  # [T, hidden]
        return y


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
        y: torch.Tensor = self.model.norm(x)  # [T, hidden]
        return y

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
