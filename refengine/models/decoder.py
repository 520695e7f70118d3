"""The decoder: Llama / Qwen2 / Mistral-family causal LM over a paged KV cache.

Owns `CausalLM` and its modules; the architecture (`ModelConfig`) is refengine.models.model_config's, the layers
(linear, merged linear, RMSNorm, rotary embedding, SiLU-and-mul, attention) are refengine/layers/'s. Module names
are Hugging Face's except the merged projections, vLLM's: `qkv_proj` (q, k, v) and `gate_up_proj` (gate, up), one
GEMM each where the checkpoint has three and two. `CausalLM.checkpoint_weights` names every weight as the
checkpoint does, merged ones by their shards, for the loaders (refengine/models/loader.py, hf_folder.py) and the
transformers twin (hf_twin.py).

One forward takes the flat token batch of a step: every scheduled token of every sequence, prefill chunks and
decodes mixed, concatenated in `query_start_loc` order. Each attention layer writes this step's K/V into the
paged cache first (`reshape_and_cache`) and then attends over the cache (`unified_attention`), so a token sees
both the KV cached by earlier steps and the KV of earlier tokens of its own chunk.

A layer carries the residual stream beside the hidden states, as vLLM's: each RMSNorm adds the residual of the
block before it (`fused_add_rms_norm`). With the triton attention backend the norms, RoPE and SiLU-and-mul are
fused Triton kernels (cbbench.kernels); with the torch backend they are those kernels' torch oracles
(cbbench.kernels.reference). Both follow transformers' modeling_llama / modeling_qwen2 op for op (RMSNorm in
float32, cos/sin in float32 then cast, rotate-half RoPE, every intermediate rounded where transformers rounds it,
residual order), so float32 logits agree with HF's to rounding.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from refengine.layers.activation import SiluAndMul
from refengine.layers.attention import AttentionBackend, AttentionMetadata
from refengine.layers.layernorm import RMSNorm
from refengine.layers.linear import Linear, MergedLinear
from refengine.layers.rotary_embedding import RotaryEmbedding
from refengine.models.model_config import ModelConfig, rope_inv_freq


class Embedding(nn.Embedding):
    """nn.Embedding without torch's initialiser (see refengine.layers.linear.Linear)."""

    def reset_parameters(self) -> None:
        pass


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, backend: AttentionBackend, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        h = config.hidden_size
        shards = {"q_proj": self.q_size, "k_proj": self.kv_size, "v_proj": self.kv_size}
        self.qkv_proj = MergedLinear(h, shards, bias=config.attention_bias)
        self.o_proj = Linear(self.q_size, h, bias=False)
        self.rotary_emb = rotary_emb  # one module, shared by every layer (its cos/sin cache with it)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, (H + 2 kvH) * D]: q | k | v
        # q and k are neighbours in qkv: rotated as one tensor of H + kvH heads (in place with the Triton kernel)
        qk = self.rotary_emb(positions, qkv[:, : self.q_size + self.kv_size].view(n, -1, self.head_dim))
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]  # [T, H, D], [T, kvH, D] (strided views)
        v = qkv[:, self.q_size + self.kv_size :].view(n, self.num_kv_heads, self.head_dim)  # [T, kvH, D]
        k_cache, v_cache = kv_cache  # each [num_blocks, block_size, kvH, D]
        self.backend.reshape_and_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty((n, self.num_heads, self.head_dim), dtype=x.dtype, device=x.device)  # [T, H, D]
        self.backend.attend(q, k_cache, v_cache, out, meta, self.scale)
        y: torch.Tensor = self.o_proj(out.view(n, self.q_size))  # [T, hidden]
        return y


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up as one GEMM (gate_up_proj)."""

    def __init__(self, config: ModelConfig, use_triton: bool) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedLinear(h, {"gate_proj": i, "up_proj": i}, bias=False)
        self.down_proj = Linear(i, h, bias=False)
        self.act_fn = SiluAndMul(use_triton=use_triton)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.down_proj(self.act_fn(self.gate_up_proj(x)))  # [T, hidden]
        return y


class DecoderLayer(nn.Module):
    """vLLM's residual stream: the layer takes and returns (hidden, residual); each norm adds the residual of the
    block before it (fused), so the last layer's MLP output is added by the final norm."""

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, rotary_emb: RotaryEmbedding, use_triton: bool
    ) -> None:
        super().__init__()
        self.self_attn = Attention(config, backend, rotary_emb)
        self.mlp = MLP(config, use_triton)
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, use_triton=use_triton)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, use_triton=use_triton)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] (the block output not yet added), residual [T, hidden] or None in the first layer."""
        if residual is None:
            residual = x
            x = self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(
        self, config: ModelConfig, backend: AttentionBackend, rotary_emb: RotaryEmbedding, use_triton: bool
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, backend, rotary_emb, use_triton) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, use_triton=use_triton)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, attn_backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.attn_backend = attn_backend
        # the fused Triton kernels (norms, RoPE, SiLU-and-mul) go with the Triton attention backend (the default on
        # CUDA; the interpreter's on a CPU); the torch backend runs their torch oracles and never imports Triton
        self.use_triton_kernels = attn_backend.name == "triton"
        rotary_emb = RotaryEmbedding(
            rope_inv_freq(config), config.max_position_embeddings, use_triton=self.use_triton_kernels
        )
        self.model = DecoderModel(config, attn_backend, rotary_emb, self.use_triton_kernels)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self._lm_head_t: torch.Tensor | None = None  # CPU only: lm_head.weight transposed once (compute_logits)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share lm_head with the embeddings when the config ties them (re-run after `to_empty`)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def checkpoint_weights(self, *, remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, tensor) of every weight as a checkpoint stores it: a merged projection's parameter
        appears as its shards, writable row views named after the checkpoint's projections
        (`model.layers.0.self_attn.qkv_proj.weight` -> `...self_attn.q_proj.weight`, `k_proj`, `v_proj`). Loaders
        copy into them; the transformers twin reads them. `remove_duplicate=False` also names a tied weight
        twice (`lm_head.weight` beside `model.embed_tokens.weight`)."""
        for name, param in self.named_parameters(remove_duplicate=remove_duplicate):
            module_name, _, kind = name.rpartition(".")
            module = self.get_submodule(module_name)
            if isinstance(module, MergedLinear):
                parent = module_name.rpartition(".")[0]
                for shard, view in module.shard_views(param).items():
                    yield f"{parent}.{shard}.{kind}", view
            else:
                yield name, param

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
        residual: torch.Tensor | None = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x, residual = layer(positions, x, residual, kv_cache, attn_metadata)
        if residual is None:  # no layers (ModelConfig forbids it; narrows the type)
            raise ValueError("the model has no layers")
        y: torch.Tensor = self.model.norm(x, residual)[0]  # [T, hidden]
        return y

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [n, hidden] -> float32 logits [n, vocab], written into `out` when given (a float32 [n, vocab]
        buffer the caller reuses: on the CPU a fresh 64 x 151936 result is 39 MB of new pages every step)."""
        if hidden.device.type != "cpu":
            logits = self.lm_head(hidden).float()  # [n, vocab] float32
            return logits if out is None else out.copy_(logits)
        # On the CPU, F.linear picks a slower kernel for a few rows against a vocab-sized weight than a plain
        # matmul with the weight transposed once (docs/cpu-profile.md).
        # (weights never change after loading; the copy is made at the first step)
        if self._lm_head_t is None:
            self._lm_head_t = self.lm_head.weight.detach().t().contiguous()  # [hidden, vocab]
        if out is None:
            return (hidden @ self._lm_head_t).float()  # [n, vocab] float32
        if hidden.dtype == torch.float32:
            return torch.mm(hidden, self._lm_head_t, out=out)
        return out.copy_(hidden @ self._lm_head_t)
