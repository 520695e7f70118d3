"""Triton paged causal attention for one continuous-batching step: prefill chunks and decodes in one launch.

Same layout and semantics as `unified_attention_ref` (the oracle, kernels/reference.py). K and V are read only
from the paged cache, through `block_table`; the step's new tokens must already be stored there.

Work split. A program owns one *query block* (BLOCK_Q consecutive query tokens of one sequence) for one KV head,
and packs those tokens x the NUM_QUERIES_PER_KV query heads sharing that KV head into the BLOCK_M rows of its
query tile (row m = token m // G, head m % G, G = NUM_QUERIES_PER_KV). Each K/V tile is therefore loaded once for
the whole GQA group, and a decode (one token) still fills a tile of >= 16 rows, the least `tl.dot` accepts:

    BLOCK_M rows:  | tok0 h0 | tok0 h1 | ... | tok0 hG-1 | tok1 h0 | ... | padding rows (masked) |

Split-KV (flash-decoding). A decode-only step with few sequences launches too few programs to use the GPU, each
walking a long context alone. The KV tiles of a query block are then dealt to NUM_SEGMENTS programs (grid axis 2);
each writes an unnormalised partial (acc, running max, running sum) and `_reduce_segments_kernel` merges them.
`choose_num_kv_segments` says when (see its docstring).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from cbbench.kernels.reshape_and_cache import _check, check_launchable, is_interpreted

LOG2E = 1.4426950408889634  # the kernel works in base 2: exp(x * scale) == exp2(x * scale * log2(e))

# Split-KV heuristic (choose_num_kv_segments).
PROGRAMS_PER_SM = 2  # aim for about two resident programs per SM before splitting stops paying
MIN_TILES_PER_SEGMENT = 2  # a segment shorter than this is dominated by its fixed cost and the reduce
MAX_KV_SEGMENTS = 16  # partial buffers grow with this; 16 already fills an H100/H200 from a single sequence
INTERPRETER_NUM_SMS = 2  # a pretend SM count under TRITON_INTERPRET, so small CPU tests reach the split path

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


@triton.jit
def _cast_out(x, out_dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 -> output dtype, rounding to nearest even as the GPU does. The interpreter truncates fp32 -> bf16
    (a bias of up to one ulp against the oracle), so there the rounding is done on the bits first."""
    if INTERPRETED and out_dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(out_dtype)


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
    INTERPRETED: tl.constexpr,  # round bf16 stores by hand (see _cast_out)
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
        tl.store(out_ptr + o_offs, _cast_out(o, out_ptr.dtype.element_ty, INTERPRETED), mask=row_ok[:, None] & dim_ok[None, :])
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
    l = tl.sum(tl.load(segm_sum_ptr + part) * w, axis=0)
    acc = tl.load(segm_out_ptr + part[:, None] * HEAD_DIM_PAD + offs_d[None, :])  # [NUM_SEGMENTS, HEAD_DIM_PAD]
    o = tl.sum(acc * w[:, None], axis=0) / l
    o_ptr = out_ptr + token * stride_o_tok + head * stride_o_head + offs_d
    tl.store(o_ptr, _cast_out(o, out_ptr.dtype.element_ty, INTERPRETED), mask=offs_d < HEAD_DIM)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_kv_segments(
    num_seqs: int, num_tokens: int, num_kv_heads: int, max_seqlen_k: int, tile_n: int, num_sms: int
) -> int:
    """Split-KV factor for one step: 1 (single pass) or a power of 2 in [2, MAX_KV_SEGMENTS].

    Split only when all of these hold:
    - the step is decode-only (num_tokens == num_seqs: every query length is 1). With prefill chunks the query
      blocks already give parallelism, and the partial buffers would grow with every prefill token;
    - the single-pass grid, num_seqs * num_kv_heads programs, is under PROGRAMS_PER_SM * num_sms, so SMs would idle
      while a few programs each walk a whole context;
    - the longest context gives every segment at least MIN_TILES_PER_SEGMENT KV tiles.
    The factor is the smallest that fills the GPU, capped by context length and MAX_KV_SEGMENTS, rounded down to a
    power of 2 (tl.arange over segments in the reduce). Only shapes are used: no device-to-host sync.
    """
    if num_tokens != num_seqs or num_seqs == 0:
        return 1
    programs = num_seqs * num_kv_heads
    target = PROGRAMS_PER_SM * num_sms
    if programs >= target:
        return 1
    by_occupancy = triton.cdiv(target, programs)
    by_length = triton.cdiv(max_seqlen_k, tile_n) // MIN_TILES_PER_SEGMENT
    n = min(by_occupancy, by_length, MAX_KV_SEGMENTS)
    return 1 if n < 2 else 1 << (n.bit_length() - 1)


@dataclass(frozen=True)
class AttentionPlan:
    """Launch configuration of one `unified_attention` call (what the wrapper chose, inspectable by tests)."""

    block_m: int  # query-tile rows: block_q tokens x G heads, a power of 2 >= 16
    block_q: int  # query tokens per program
    tile_n: int  # keys per inner-loop tile
    num_kv_segments: int  # 1 = single pass; > 1 = split-KV + reduce
    interpreted: bool  # running under TRITON_INTERPRET (the kernels were decorated with it set)
    upcast: bool  # convert loads to fp32 (interpreter) instead of feeding 16-bit values to tl.dot


def plan_unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_seqs: int,
    *,
    num_kv_segments: int | None = None,
    block_m: int | None = None,
    max_seqlen_k: int | None = None,
) -> AttentionPlan:
    """Tiles and split factor for this step (heuristics documented inline); explicit arguments override them."""
    num_tokens, num_heads, _ = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    group = num_heads // num_kv_heads
    interpreted = is_interpreted(_unified_attention_kernel)
    if block_m is None:
        # decode-only: 16, the least tl.dot takes, wastes the fewest rows on one-token queries; with prefill
        # chunks on a GPU, 64 rows let every K/V tile loaded serve more query tokens (16-bit only: an fp32 ieee
        # dot at 64 x 128 spills registers on sm_90, see test_kernels_compile_for_sm90_without_spills)
        prefill = num_tokens > num_seqs
        block_m = 64 if prefill and not interpreted and q.dtype != torch.float32 else 16
    block_m = max(block_m, triton.next_power_of_2(group))  # one token's G heads must fit in a tile
    _check(block_m >= 16 and block_m & (block_m - 1) == 0, f"block_m must be a power of 2 >= 16, got {block_m}")
    # 64-key tiles halve the loop trips of 32 on a GPU; fp32 (ieee dot, twice the registers) and the interpreter
    # (cost per element, not per trip) use 32
    tile_n = 32 if interpreted or q.dtype == torch.float32 else 64
    if num_kv_segments is None:
        if max_seqlen_k is None:  # sync-free upper bound: the width of the block table
            max_seqlen_k = block_table.shape[1] * block_size
        num_sms = INTERPRETER_NUM_SMS if interpreted or q.device.type != "cuda" else _num_sms(q.device.index or 0)
        num_kv_segments = choose_num_kv_segments(num_seqs, num_tokens, num_kv_heads, max_seqlen_k, tile_n, num_sms)
    _check(
        1 <= num_kv_segments <= 64 and num_kv_segments & (num_kv_segments - 1) == 0,
        f"num_kv_segments must be a power of 2 in [1, 64], got {num_kv_segments}",
    )
    upcast = interpreted and q.dtype != torch.float32
    return AttentionPlan(block_m, block_m // group, tile_n, num_kv_segments, interpreted, upcast)


def unified_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    *,
    num_kv_segments: int | None = None,
    block_m: int | None = None,
    max_seqlen_k: int | None = None,
) -> torch.Tensor:
    """Causal paged attention over a mixed prefill/decode batch; writes and returns `out` (see module docstring).

    Keyword-only knobs (tests and benchmarks): `num_kv_segments` forces the split-KV factor (1 = single pass),
    `block_m` the query-tile rows, `max_seqlen_k` tightens the split heuristic's context bound.
    Rows of `out` past query_start_loc[-1] (padding tokens) are left untouched.
    """
    _check(q.dim() == 3 and out.shape == q.shape, f"q/out must be [num_tokens, num_heads, head_dim], got {q.shape} / {out.shape}")
    _check(k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
           f"k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got {k_cache.shape} / {v_cache.shape}")
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    _check(cache_head_dim == head_dim, f"cache head_dim {cache_head_dim} != q head_dim {head_dim}")
    _check(num_heads % num_kv_heads == 0, f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    _check(q.dtype == k_cache.dtype == v_cache.dtype, f"q/k_cache/v_cache dtypes differ: {q.dtype}/{k_cache.dtype}/{v_cache.dtype}")
    _check(q.dtype in (torch.float32, torch.float16, torch.bfloat16), f"unsupported dtype {q.dtype}")
    _check(out.dtype.is_floating_point, f"out must be floating point, got {out.dtype}")
    for name, t in (("q", q), ("out", out), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check(t.stride(-1) == 1, f"{name} must be contiguous in head_dim, got strides {t.stride()}")
    num_seqs = seq_lens.shape[0]
    _check(query_start_loc.shape == (num_seqs + 1,), f"query_start_loc must be [{num_seqs + 1}], got {tuple(query_start_loc.shape)}")
    _check(block_table.dim() == 2 and block_table.shape[0] == num_seqs,
           f"block_table must be [{num_seqs}, max_blocks], got {tuple(block_table.shape)}")
    _check(block_table.stride(1) == 1, f"block_table rows must be contiguous, got strides {block_table.stride()}")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("block_table", block_table)):
        _check(t.dtype in (torch.int32, torch.int64), f"{name} must be int32/int64, got {t.dtype}")
    devices = {t.device for t in (q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table)}
    _check(len(devices) == 1, f"all tensors must be on one device, got {devices}")
    if num_tokens == 0 or num_seqs == 0:
        return out
    check_launchable(_unified_attention_kernel, q.device)

    plan = plan_unified_attention(q, k_cache, block_table, num_seqs, num_kv_segments=num_kv_segments,
                                  block_m=block_m, max_seqlen_k=max_seqlen_k)
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    # Grid bound: sequence i has ceil(n_i / BLOCK_Q) <= n_i // BLOCK_Q + 1 query blocks, and
    # sum_i n_i // BLOCK_Q <= (sum_i n_i) // BLOCK_Q, so num_tokens // BLOCK_Q + num_seqs covers every block
    # without reading query_start_loc on the host. Programs past a sequence's last block return at once.
    num_q_blocks = num_tokens // plan.block_q + num_seqs
    grid = (num_q_blocks, num_kv_heads, plan.num_kv_segments)
    split = plan.num_kv_segments > 1
    if split:
        segm_out = torch.empty(num_tokens, num_heads, plan.num_kv_segments, head_dim_pad, dtype=torch.float32, device=q.device)
        segm_max = torch.empty(num_tokens, num_heads, plan.num_kv_segments, dtype=torch.float32, device=q.device)
        segm_sum = torch.empty_like(segm_max)
    else:
        segm_out = segm_max = segm_sum = out  # not touched when NUM_SEGMENTS == 1
    _unified_attention_kernel[grid](
        q, k_cache, v_cache, out, segm_out, segm_max, segm_sum,
        query_start_loc, seq_lens, block_table,
        scale * LOG2E, num_seqs, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_QUERIES_PER_KV=num_heads // num_kv_heads,
        BLOCK_SIZE=block_size, BLOCK_Q=plan.block_q, BLOCK_M=plan.block_m, TILE_N=plan.tile_n,
        NUM_SEGMENTS=plan.num_kv_segments, UPCAST=plan.upcast, INTERPRETED=plan.interpreted,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
    )  # fmt: skip
    if split:
        _reduce_segments_kernel[(num_tokens, num_heads)](
            out, segm_out, segm_max, segm_sum, query_start_loc, num_seqs, num_heads,
            out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim_pad, NUM_SEGMENTS=plan.num_kv_segments,
            INTERPRETED=plan.interpreted,
        )  # fmt: skip
    return out
