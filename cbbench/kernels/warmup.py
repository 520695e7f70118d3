"""Compile, before the first step, every Triton kernel variant an engine's steps can pick.

A variant is a set of constexpr values (plus argument dtypes and the specializations Triton keeps); for one
engine the model, cache layout and dtype fix all of them except what `plan_unified_attention` chooses per step:
- BLOCK_M / BLOCK_Q: one value for decode-only steps and one for steps with prefill chunks;
- NUM_SEGMENTS (split-KV): 1, or a power of 2 up to what the widest block table allows on this GPU (the choice
  is monotone in the context bound, so every power of 2 between 2 and the largest is reachable), each with its
  `_reduce_segments_kernel`.
num_seqs and the block-table stride are `do_not_specialize` (triton_unified_attention.py), so their values add no
variants. Each variant is launched once on a tiny batch through the public wrappers (the same path the model
takes, with the index dtypes the model runner uses: int32 metadata, int64 slot_mapping), so the compile happens
here and not inside a measured run. Under TRITON_INTERPRET nothing is compiled: the launches still run (tests).

The decoder layer's fused kernels (RMSNorm with and without the residual add, rotary embedding, SiLU-and-mul) have
one variant per model: their one per-step int, the row count, is `do_not_specialize`, and their strides are the
model's. `warmup_layer_kernels` launches each once on tensors laid out as the model's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache
from cbbench.kernels.triton_rms_norm import fused_add_rms_norm, rms_norm
from cbbench.kernels.triton_rope import rotary_embedding
from cbbench.kernels.triton_silu_and_mul import silu_and_mul
from cbbench.kernels.triton_unified_attention import plan_unified_attention, unified_attention

_WARMUP_BLOCKS = 4  # cache blocks of the tiny warm-up batch: enough for a prefill chunk and a short decode


@dataclass(frozen=True)
class Variant:
    """One unified_attention launch configuration that a step can pick."""

    prefill: bool  # a step with prefill chunks (num_tokens > num_seqs), or decode-only
    block_m: int
    num_kv_segments: int


def attention_variants(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    max_model_len: int,
    device: torch.device | str,
) -> list[Variant]:
    """The variants `plan_unified_attention` can choose for an engine of these shapes (see module docstring)."""
    device = torch.device(device)
    max_blocks = -(-max_model_len // block_size)
    k_cache = torch.empty(1, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    table = torch.zeros(1, max_blocks, dtype=torch.int32, device=device)  # the widest table a step can have
    decode = plan_unified_attention(torch.empty(1, num_heads, head_dim, dtype=dtype, device=device), k_cache, table, 1)
    prefill = plan_unified_attention(torch.empty(2, num_heads, head_dim, dtype=dtype, device=device), k_cache, table, 1)
    # one sequence alone gives the most split-KV segments; every power of 2 below it is reachable too
    segments = [1] + [1 << k for k in range(1, decode.num_kv_segments.bit_length())]
    return [Variant(False, decode.block_m, s) for s in segments] + [Variant(True, prefill.block_m, 1)]


def warmup_attention_kernels(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    max_model_len: int,
    device: torch.device | str,
) -> list[Variant]:
    """Launch reshape_and_cache and every variant of `attention_variants` once; returns the variants launched."""
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    cache_shape = (_WARMUP_BLOCKS, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = randn(*cache_shape), randn(*cache_shape)
    block_table = torch.arange(_WARMUP_BLOCKS, dtype=torch.int32, device=device)[None, :]  # [1, blocks]
    capacity = _WARMUP_BLOCKS * block_size
    num_tokens = min(capacity, 8)
    k, v = randn(num_tokens, num_kv_heads, head_dim), randn(num_tokens, num_kv_heads, head_dim)
    reshape_and_cache(k, v, k_cache, v_cache, torch.arange(num_tokens, dtype=torch.int64, device=device))
    variants = attention_variants(num_heads, num_kv_heads, head_dim, block_size, dtype, max_model_len, device)
    for var in variants:
        n = num_tokens if var.prefill else 1
        q = randn(n, num_heads, head_dim)
        out = torch.empty_like(q)
        qsl = torch.tensor([0, n], dtype=torch.int32, device=device)
        seq_lens = torch.tensor([capacity if not var.prefill else n], dtype=torch.int32, device=device)
        unified_attention(
            q,
            k_cache,
            v_cache,
            out,
            qsl,
            seq_lens,
            block_table,
            head_dim**-0.5,
            num_kv_segments=var.num_kv_segments,
            block_m=var.block_m,
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return variants


def warmup_layer_kernels(
    hidden_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> None:
    """Launch the decoder layer's fused kernels once each, on inputs with the model's layout: RMSNorm of a
    [T, hidden] row block (with and without the residual), RoPE on the q|k heads of a merged qkv output, SiLU-and-mul
    on a merged gate_up output."""
    device = torch.device(device)
    num_tokens = 2
    x = torch.zeros(num_tokens, hidden_size, dtype=dtype, device=device)
    weight = torch.ones(hidden_size, dtype=dtype, device=device)
    rms_norm(x, weight, 1e-6)
    fused_add_rms_norm(x, torch.zeros_like(x), weight, 1e-6)
    qkv = torch.zeros(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=device)
    qk = qkv[:, : (num_heads + num_kv_heads) * head_dim].view(num_tokens, -1, head_dim)
    cos_sin_cache = torch.zeros(1, head_dim, dtype=dtype, device=device)
    rotary_embedding(torch.zeros(num_tokens, dtype=torch.int64, device=device), qk, cos_sin_cache)
    silu_and_mul(torch.zeros(num_tokens, 2 * intermediate_size, dtype=dtype, device=device))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
