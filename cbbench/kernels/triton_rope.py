"""Triton rotary embedding (neox style, rotate-half, as Qwen2 and Llama use), in place (vLLM's `rotary_embedding`).

x [num_tokens, num_heads, head_dim] is rotated at `positions` [num_tokens], reading cos and sin from
cos_sin_cache [max_position, head_dim] (cosines in the first half of a row, sines in the second; Llama-3.1's
scaled frequencies are already in it: refengine/models/model_config.py `rope_inv_freq`). A decoder passes the
queries and the keys as one x: they are the first num_heads + num_kv_heads heads of the merged qkv projection's
output, a strided view rotated where it lies. One program per token (rows_per_program) rotates all its heads: one launch where the
torch code runs about ten per layer.

Arithmetic as `rotary_embedding_ref`: each of x1 * cos, x2 * sin, ... rounded to the model dtype before the sum.
Positions are not checked against max_position (that would read them on the host): the engine bounds them by
max_model_len, which the model config bounds by max_position_embeddings, the cache's length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cbbench.kernels.triton_common import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    cast_rne,
    check_launchable,
    is_interpreted,
    rows_per_program,
)

DO_NOT_SPECIALIZE = ("num_tokens",)  # changes from step to step (kernels/triton_rms_norm.py)


# A Triton program (untyped: see kernels/triton_rms_norm.py).
@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE)  # type: ignore[untyped-decorator]
def _rotary_embedding_kernel(  # type: ignore[no-untyped-def]
    positions_ptr,  # [num_tokens]
    x_ptr,  # [num_tokens, num_heads, head_dim]   token/head strides free, last dim contiguous; rotated in place
    cos_sin_cache_ptr,  # [max_position, head_dim]   cos | sin, rows contiguous
    num_tokens,
    stride_x_tok,
    stride_x_head,
    stride_cache,
    NUM_HEADS: tl.constexpr,
    HALF: tl.constexpr,  # head_dim // 2
    HEADS_PAD: tl.constexpr,  # next power of 2 of NUM_HEADS (tl.arange needs a power of 2)
    HALF_PAD: tl.constexpr,  # next power of 2 of HALF
    ROWS: tl.constexpr,  # tokens per program (triton_common.rows_per_program)
    INTERPRETED: tl.constexpr,  # round bf16 by hand (see cast_rne)
):
    tokens = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # [ROWS]
    t_mask = tokens < num_tokens
    pos = tl.load(positions_ptr + tokens, mask=t_mask, other=0).to(tl.int64)[:, None, None]  # [ROWS, 1, 1]
    offs_h = tl.arange(0, HEADS_PAD).to(tl.int64)[None, :, None]  # [1, HEADS_PAD, 1]
    offs_d = tl.arange(0, HALF_PAD)[None, None, :]  # [1, 1, HALF_PAD]
    d_mask = offs_d < HALF
    cs_ptrs = cos_sin_cache_ptr + pos * stride_cache + offs_d  # [ROWS, 1, HALF_PAD], broadcast over heads
    cos = tl.load(cs_ptrs, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptrs + HALF, mask=d_mask, other=0.0).to(tl.float32)
    mask = t_mask[:, None, None] & (offs_h < NUM_HEADS) & d_mask  # [ROWS, HEADS_PAD, HALF_PAD]
    p1 = x_ptr + tokens[:, None, None] * stride_x_tok + offs_h * stride_x_head + offs_d
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    # (out1, out2) = (x1 cos - x2 sin, x2 cos + x1 sin), every product rounded to the model dtype first
    x1c = cast_rne(x1 * cos, dtype, INTERPRETED).to(tl.float32)
    x2s = cast_rne(x2 * sin, dtype, INTERPRETED).to(tl.float32)
    x2c = cast_rne(x2 * cos, dtype, INTERPRETED).to(tl.float32)
    x1s = cast_rne(x1 * sin, dtype, INTERPRETED).to(tl.float32)
    tl.store(p1, cast_rne(x1c - x2s, dtype, INTERPRETED), mask=mask)
    tl.store(p1 + HALF, cast_rne(x2c + x1s, dtype, INTERPRETED), mask=mask)


def rotary_embedding(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Rotate x [num_tokens, num_heads, head_dim] in place at `positions`; returns x (`rotary_embedding_ref`,
    which returns a new tensor instead)."""
    if x.dim() != 3 or x.shape[2] % 2:
        raise ValueError(
            f"rotary_embedding: x must be [num_tokens, num_heads, head_dim] (head_dim even), got {x.shape}"
        )
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != x.shape[2]:
        raise ValueError(
            f"rotary_embedding: cos_sin_cache must be [max_position, {x.shape[2]}], got {cos_sin_cache.shape}"
        )
    if positions.dim() != 1 or positions.shape[0] != x.shape[0] or positions.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"rotary_embedding: positions must be int32/int64 [{x.shape[0]}], got {positions.dtype} {positions.shape}"
        )
    if x.stride(2) != 1 or cos_sin_cache.stride(1) != 1 or not positions.is_contiguous():
        raise ValueError(
            "rotary_embedding: x and cos_sin_cache must be contiguous in head_dim and positions contiguous, got "
            f"strides {x.stride()} / {cos_sin_cache.stride()} / {positions.stride()}"
        )
    if x.dtype not in FLOAT_DTYPES or cos_sin_cache.dtype != x.dtype:
        raise ValueError(
            f"rotary_embedding: x and cos_sin_cache must share a float dtype, got {x.dtype} / {cos_sin_cache.dtype}"
        )
    if positions.device != x.device or cos_sin_cache.device != x.device:
        raise ValueError(
            f"rotary_embedding: tensors on {positions.device} / {x.device} / {cos_sin_cache.device}, not one device"
        )
    if x.shape[0] == 0:
        return x
    check_launchable(_rotary_embedding_kernel, x.device)
    num_tokens, num_heads, half = x.shape[0], x.shape[1], x.shape[2] // 2
    rows = rows_per_program(_rotary_embedding_kernel, num_tokens)
    _rotary_embedding_kernel[(triton.cdiv(num_tokens, rows),)](
        positions, x, cos_sin_cache, num_tokens, x.stride(0), x.stride(1), cos_sin_cache.stride(0),
        NUM_HEADS=num_heads, HALF=half, HEADS_PAD=triton.next_power_of_2(num_heads),
        HALF_PAD=triton.next_power_of_2(half), ROWS=rows, INTERPRETED=is_interpreted(_rotary_embedding_kernel),
        num_warps=4,
    )  # fmt: skip
    return x
