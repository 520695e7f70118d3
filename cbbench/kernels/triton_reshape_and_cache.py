"""Triton KV store: write this step's new K and V into their paged-cache slots (vLLM's `reshape_and_cache`).

One program per token copies all of that token's KV heads. A negative slot marks a padding token: the program
returns before touching the cache, so a padded batch can never overwrite a live block.

Specialization: the kernel takes no integer that changes from step to step (the number of tokens is the grid,
not an argument; its strides are fixed by the model's K/V layout and the cache's), so, unlike unified_attention's
num_seqs and block-table stride, nothing needs `do_not_specialize`. The one per-step pointer, slot_mapping, may be
a view into a packed input buffer whose offset changes with the step's size: Triton would compile a second variant
the first time it is not 16-byte aligned, so it is `do_not_specialize_on_alignment` (a scalar load per program:
the hint buys nothing). A run then compiles one variant per layout, which `cbbench.kernels.warmup` does up front.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl

from cbbench.kernels.triton_common import FLOAT_DTYPES, INDEX_DTYPES, check_launchable

# older Triton has no do_not_specialize_on_alignment: there the pointer stays specialized (a possible extra variant)
_JIT_OPTIONS = (
    {"do_not_specialize_on_alignment": ["slot_mapping_ptr"]}
    if "do_not_specialize_on_alignment" in inspect.signature(triton.jit).parameters
    else {}
)


# A Triton program: Triton reads its parameter annotations (tl.constexpr), and its pointers and scalars have no
# Python type for mypy to check, so the decorator and the definition are left untyped (pyproject.toml [tool.mypy]).
@triton.jit(**_JIT_OPTIONS)  # type: ignore[untyped-decorator]
def _reshape_and_cache_kernel(  # type: ignore[no-untyped-def]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]        token/head strides free, last dim contiguous
    v_ptr,  # [num_tokens, num_kv_heads, head_dim]        same
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]  last dim contiguous
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]  last dim contiguous
    slot_mapping_ptr,  # [num_tokens]   block_id * block_size + offset; negative = padding
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr,  # next power of 2 of NUM_KV_HEADS (tl.arange needs a power of 2)
    HEAD_DIM_PAD: tl.constexpr,  # next power of 2 of HEAD_DIM
    BLOCK_SIZE: tl.constexpr,  # cache block size (tokens per block)
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    offs_h = tl.arange(0, HEADS_PAD).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)

    k = tl.load(k_ptr + token * stride_k_tok + offs_h[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_v_tok + offs_h[:, None] * stride_v_head + offs_d[None, :], mask=mask)
    kc = k_cache_ptr + block * stride_kc_blk + offset * stride_kc_slot + offs_h[:, None] * stride_kc_head
    vc = v_cache_ptr + block * stride_vc_blk + offset * stride_vc_slot + offs_h[:, None] * stride_vc_head
    tl.store(kc + offs_d[None, :], k, mask=mask)
    tl.store(vc + offs_d[None, :], v, mask=mask)


def reshape_and_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k/v [num_tokens, num_kv_heads, head_dim] at `slot_mapping` in k_cache/v_cache
    [num_blocks, block_size, num_kv_heads, head_dim]; negative slots are skipped. Same semantics as
    `reshape_and_cache_ref`, except that k/v must already have the cache dtype (no conversion in the store)."""
    if k.dim() != 3 or v.shape != k.shape:
        raise ValueError(f"k/v must both be [num_tokens, num_kv_heads, head_dim], got {k.shape} / {v.shape}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {k_cache.shape} / {v_cache.shape}"
        )
    num_tokens, num_kv_heads, head_dim = k.shape
    if k_cache.shape[2] != num_kv_heads or k_cache.shape[3] != head_dim:
        raise ValueError(f"cache heads/head_dim {tuple(k_cache.shape[2:])} do not match k {(num_kv_heads, head_dim)}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != num_tokens or not slot_mapping.is_contiguous():
        raise ValueError(f"slot_mapping must be a contiguous [{num_tokens}], got {tuple(slot_mapping.shape)}")
    if slot_mapping.dtype not in INDEX_DTYPES:
        raise ValueError(f"slot_mapping must be int32/int64, got {slot_mapping.dtype}")
    if k_cache.dtype not in FLOAT_DTYPES:
        raise ValueError(f"cache dtype must be one of {FLOAT_DTYPES}, got {k_cache.dtype}")
    if not k.dtype == v.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(
            f"k/v/k_cache/v_cache dtypes must match, got {k.dtype}/{v.dtype}/{k_cache.dtype}/{v_cache.dtype}"
        )
    if k.stride(2) != 1 or v.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError(
            f"k/v/k_cache/v_cache must be contiguous in head_dim, got strides {k.stride()} / {v.stride()} / "
            f"{k_cache.stride()} / {v_cache.stride()}"
        )
    device = k.device
    if v.device != device or k_cache.device != device or v_cache.device != device or slot_mapping.device != device:
        raise ValueError(
            f"all tensors must be on one device, got {[t.device for t in (k, v, k_cache, v_cache, slot_mapping)]}"
        )
    if num_tokens == 0:
        return
    check_launchable(_reshape_and_cache_kernel, k.device)
    _reshape_and_cache_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=k_cache.shape[1],
    )  # fmt: skip
