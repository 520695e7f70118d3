"""The Triton programs of `unified_attention` (kernels/triton_unified_attention.py, whose docstring describes the work
split and split-KV): the attention kernel, its helpers and the reduce of split-KV partials."""

from __future__ import annotations

import triton
import triton.language as tl

from cbbench.kernels.triton_common import cast_rne

# Integer arguments that change from step to step. Triton specializes an int argument on its value being 1 and on
# its divisibility by 16, compiling a new variant for each combination met: num_seqs (1 at a lone decode) and the
# block table's row stride (its width, cdiv(longest context, block_size), grows as requests decode) would make
# the first steps of a run, and every later new combination, compile inside the measured run. Every other int
# argument is fixed by the model and the cache layout, so it stays specialized (divisibility helps vector loads).
DO_NOT_SPECIALIZE = ("num_seqs", "stride_bt_seq")
REDUCE_DO_NOT_SPECIALIZE = ("num_seqs",)


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_idx, num_seqs, BLOCK_Q: tl.constexpr):
    """Sequence owning global query block `q_block_idx`: the last i with query_start_loc[i] // BLOCK_Q + i <= it.

    Sequence i's blocks start at global index query_start_loc[i] // BLOCK_Q + i (see the grid bound in the
    wrapper); that map is strictly increasing in i, so a binary search finds the owner.
    """
    lo: tl.int32 = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_idx:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION: tl.constexpr):
    """Fold one KV tile into the running softmax (base 2).

    acc [BLOCK_M, D] fp32 unnormalised output, m_i / l_i [BLOCK_M] running max / running sum of exp2,
    s [BLOCK_M, TILE_N] scores already scaled by scale * log2(e), -inf where masked, v [TILE_N, D].
    """
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # a row with every score masked so far keeps m = -inf; shifting by 0 then gives exp2(-inf) = 0, not NaN
    m_shift = tl.where(m_new > float("-inf"), m_new, 0.0)
    p = tl.exp2(s - m_shift[:, None])
    alpha = tl.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc=acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i


@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE)
def _unified_attention_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    out_ptr,  # [num_tokens, num_heads, head_dim]                       written when NUM_SEGMENTS == 1
    segm_out_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS, HEAD_DIM_PAD] fp32   written when NUM_SEGMENTS > 1
    segm_max_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] fp32                 written when NUM_SEGMENTS > 1
    segm_sum_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] fp32                 written when NUM_SEGMENTS > 1
    query_start_loc_ptr,  # [num_seqs + 1]
    seq_lens_ptr,  # [num_seqs]
    block_table_ptr,  # [num_seqs, max_blocks]
    qk_scale,  # softmax scale * log2(e)
    num_seqs,
    num_heads,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_kc_blk,
    stride_kc_slot,
    stride_kc_head,
    stride_vc_blk,
    stride_vc_slot,
    stride_vc_head,
    stride_bt_seq,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # next power of 2 of HEAD_DIM, >= 16; extra dims are masked to 0
    NUM_QUERIES_PER_KV: tl.constexpr,  # G: query heads per KV head
    BLOCK_SIZE: tl.constexpr,  # cache block size
    BLOCK_Q: tl.constexpr,  # query tokens per program = BLOCK_M // G
    BLOCK_M: tl.constexpr,  # rows of the query tile, a power of 2 >= 16
    TILE_N: tl.constexpr,  # keys per inner-loop tile, a power of 2 >= 16
    NUM_SEGMENTS: tl.constexpr,  # 1: write `out`; > 1: write partials for _reduce_segments_kernel
    UPCAST: tl.constexpr,  # convert loads to fp32: the interpreter mis-computes on raw bf16
    INTERPRETED: tl.constexpr,  # round bf16 stores by hand (see cast_rne)
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs (no tf32 rounding), ignored for 16-bit inputs
):
    q_block_global = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    seq_idx = _find_seq_idx(query_start_loc_ptr, q_block_global, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    q_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    q_block = q_block_global - (q_start // BLOCK_Q + seq_idx)
    if q_block * BLOCK_Q >= q_len:  # past this sequence's last query block (the grid is an upper bound)
        return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, TILE_N)
    q_idx = q_block * BLOCK_Q + offs_m // NUM_QUERIES_PER_KV  # query token within the sequence's new tokens
    head = (kv_head * NUM_QUERIES_PER_KV + offs_m % NUM_QUERIES_PER_KV).to(tl.int64)
    row_ok = (offs_m < BLOCK_Q * NUM_QUERIES_PER_KV) & (q_idx < q_len)
    dim_ok = offs_d < HEAD_DIM
    token = (q_start + q_idx).to(tl.int64)

    q_offs = token[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    if UPCAST:
        q = q.to(tl.float32)

    seq_len = tl.load(seq_lens_ptr + seq_idx)
    context_len = seq_len - q_len  # tokens cached before this step
    q_pos = context_len + q_idx  # absolute position; row attends to keys 0..q_pos
    # keys any row of this block can see: up to the position of its last query token
    kv_end = tl.minimum(seq_len, context_len + (q_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE_N)
    tiles_per_segment = tl.cdiv(num_tiles, NUM_SEGMENTS)
    tile_lo = segment * tiles_per_segment
    tile_hi = tl.minimum(tile_lo + tiles_per_segment, num_tiles)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)
    block_table_row = block_table_ptr + seq_idx.to(tl.int64) * stride_bt_seq
    kc_head = k_cache_ptr + kv_head.to(tl.int64) * stride_kc_head
    vc_head = v_cache_ptr + kv_head.to(tl.int64) * stride_vc_head

    for tile in range(tile_lo, tile_hi):
        kv_pos = tile * TILE_N + offs_n  # [TILE_N]
        kv_ok = kv_pos < kv_end
        block_id = tl.load(block_table_row + kv_pos // BLOCK_SIZE, mask=kv_ok, other=0).to(tl.int64)
        slot = (kv_pos % BLOCK_SIZE).to(tl.int64)
        kv_mask = dim_ok[:, None] & kv_ok[None, :]
        k_offs = block_id[None, :] * stride_kc_blk + slot[None, :] * stride_kc_slot + offs_d[:, None]
        k = tl.load(kc_head + k_offs, mask=kv_mask, other=0.0)  # [HEAD_DIM_PAD, TILE_N]
        v_offs = block_id[:, None] * stride_vc_blk + slot[:, None] * stride_vc_slot + offs_d[None, :]
        v = tl.load(vc_head + v_offs, mask=kv_ok[:, None] & dim_ok[None, :], other=0.0)  # [TILE_N, HEAD_DIM_PAD]
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N] fp32
        causal = (kv_pos[None, :] <= q_pos[:, None]) & row_ok[:, None]
        s = tl.where(causal, s, float("-inf"))
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, DOT_PRECISION)

    if NUM_SEGMENTS == 1:
        o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a valid row always sees key 0, so l_i > 0 there
        o_offs = token[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :]
        tl.store(
            out_ptr + o_offs, cast_rne(o, out_ptr.dtype.element_ty, INTERPRETED), mask=row_ok[:, None] & dim_ok[None, :]
        )
    else:
        # an empty segment (tile_lo >= tile_hi) still writes m = -inf, l = 0: weight 0 in the reduce
        part = (token * num_heads + head) * NUM_SEGMENTS + segment  # [BLOCK_M]
        tl.store(segm_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(segm_max_ptr + part, m_i, mask=row_ok)
        tl.store(segm_sum_ptr + part, l_i, mask=row_ok)


@triton.jit(do_not_specialize=REDUCE_DO_NOT_SPECIALIZE)
def _reduce_segments_kernel(
    out_ptr,  # [num_tokens, num_heads, head_dim]
    segm_out_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS, HEAD_DIM_PAD] fp32
    segm_max_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] fp32
    segm_sum_ptr,  # [num_tokens, num_heads, NUM_SEGMENTS] fp32
    query_start_loc_ptr,  # [num_seqs + 1]
    num_seqs,
    num_heads,
    stride_o_tok,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    """Merge the split-KV partials of one (token, head): out = sum_s w_s acc_s / sum_s w_s l_s, w_s = 2^(m_s - M)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    if token >= tl.load(query_start_loc_ptr + num_seqs):  # padding token after the last sequence: not ours
        return
    offs_s = tl.arange(0, NUM_SEGMENTS)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    part = (token * num_heads + head) * NUM_SEGMENTS + offs_s  # [NUM_SEGMENTS]
    m = tl.load(segm_max_ptr + part)
    w = tl.exp2(m - tl.max(m, axis=0))  # segment 0 always holds key 0, so the max is finite
    denom = tl.sum(tl.load(segm_sum_ptr + part) * w, axis=0)
    acc = tl.load(segm_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :])  # [NUM_SEGMENTS, HEAD_DIM_PAD]
    o = tl.sum(acc * w[:, None], axis=0) / denom
    o_ptr = out_ptr + token * stride_o_tok + head * stride_o_head + offs_d
    tl.store(o_ptr, cast_rne(o, out_ptr.dtype.element_ty, INTERPRETED), mask=offs_d < HEAD_DIM)
