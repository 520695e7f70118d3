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

This file holds the host side (the launch plan and the wrapper that checks shapes and launches); the Triton
programs are in kernels/unified_attention_kernels.py.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from cbbench.kernels.triton_common import FLOAT_DTYPES, INDEX_DTYPES, check_launchable, is_interpreted
from cbbench.kernels.unified_attention_kernels import _reduce_segments_kernel, _unified_attention_kernel

LOG2E = 1.4426950408889634  # the kernel works in base 2: exp(x * scale) == exp2(x * scale * log2(e))

# Split-KV heuristic (choose_num_kv_segments).
PROGRAMS_PER_SM = 2  # aim for about two resident programs per SM before splitting stops paying
MIN_TILES_PER_SEGMENT = 2  # a segment shorter than this is dominated by its fixed cost and the reduce
MAX_KV_SEGMENTS = 16  # partial buffers grow with this; 16 already fills an H100/H200 from a single sequence
INTERPRETER_NUM_SMS = 2  # a pretend SM count under TRITON_INTERPRET, so small CPU tests reach the split path


@functools.cache
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
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of 2 >= 16, got {block_m}")
    # 64-key tiles halve the loop trips of 32 on a GPU; fp32 (ieee dot, twice the registers) and the interpreter
    # (cost per element, not per trip) use 32
    tile_n = 32 if interpreted or q.dtype == torch.float32 else 64
    if num_kv_segments is None:
        if max_seqlen_k is None:  # sync-free upper bound: the width of the block table
            max_seqlen_k = block_table.shape[1] * block_size
        num_sms = INTERPRETER_NUM_SMS if interpreted or q.device.type != "cuda" else _num_sms(q.device.index or 0)
        num_kv_segments = choose_num_kv_segments(num_seqs, num_tokens, num_kv_heads, max_seqlen_k, tile_n, num_sms)
    if not 1 <= num_kv_segments <= 64 or num_kv_segments & (num_kv_segments - 1):
        raise ValueError(f"num_kv_segments must be a power of 2 in [1, 64], got {num_kv_segments}")
    upcast = interpreted and q.dtype != torch.float32
    return AttentionPlan(block_m, block_m // group, tile_n, num_kv_segments, interpreted, upcast)


def _check_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> None:
    """unified_attention's shape, dtype, stride and device checks (ValueError naming what is wrong; each message is
    formatted only when its check fails)."""
    if q.dim() != 3 or out.shape != q.shape:
        raise ValueError(f"q/out must be [num_tokens, num_heads, head_dim], got {q.shape} / {out.shape}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got {k_cache.shape} / {v_cache.shape}"
        )
    _, num_heads, head_dim = q.shape
    num_kv_heads, cache_head_dim = k_cache.shape[2:]
    if cache_head_dim != head_dim:
        raise ValueError(f"cache head_dim {cache_head_dim} != q head_dim {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(f"q/k_cache/v_cache dtypes differ: {q.dtype}/{k_cache.dtype}/{v_cache.dtype}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"unsupported dtype {q.dtype}")
    if not out.dtype.is_floating_point:
        raise ValueError(f"out must be floating point, got {out.dtype}")
    if q.stride(2) != 1 or out.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError(
            f"q/out/k_cache/v_cache must be contiguous in head_dim, got strides {q.stride()} / {out.stride()} / "
            f"{k_cache.stride()} / {v_cache.stride()}"
        )
    num_seqs = seq_lens.shape[0]
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(f"query_start_loc must be [{num_seqs + 1}], got {tuple(query_start_loc.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != num_seqs:
        raise ValueError(f"block_table must be [{num_seqs}, max_blocks], got {tuple(block_table.shape)}")
    if block_table.stride(1) != 1:
        raise ValueError(f"block_table rows must be contiguous, got strides {block_table.stride()}")
    if (
        query_start_loc.dtype not in INDEX_DTYPES
        or seq_lens.dtype not in INDEX_DTYPES
        or block_table.dtype not in INDEX_DTYPES
    ):
        raise ValueError(
            "query_start_loc/seq_lens/block_table must be int32/int64, got "
            f"{query_start_loc.dtype}/{seq_lens.dtype}/{block_table.dtype}"
        )
    device = q.device
    if any(t.device != device for t in (k_cache, v_cache, out, query_start_loc, seq_lens, block_table)):
        raise ValueError(
            "all tensors must be on one device, got "
            f"{[t.device for t in (q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table)]}"
        )


def _segment_buffers(out: torch.Tensor, num_segments: int, head_dim_pad: int) -> tuple[torch.Tensor, ...]:
    """Split-KV partials (acc [T, H, S, D_pad], running max and sum [T, H, S], fp32); `out` stands in for all three
    when there is one segment (the kernel does not touch them then)."""
    if num_segments == 1:
        return out, out, out
    num_tokens, num_heads = out.shape[:2]
    segm_out = torch.empty(num_tokens, num_heads, num_segments, head_dim_pad, dtype=torch.float32, device=out.device)
    segm_max = torch.empty(num_tokens, num_heads, num_segments, dtype=torch.float32, device=out.device)
    return segm_out, segm_max, torch.empty_like(segm_max)


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
    _check_inputs(q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table)
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    if num_tokens == 0 or num_seqs == 0:
        return out
    check_launchable(_unified_attention_kernel, q.device)

    plan = plan_unified_attention(
        q, k_cache, block_table, num_seqs, num_kv_segments=num_kv_segments, block_m=block_m, max_seqlen_k=max_seqlen_k
    )
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    # Grid bound: sequence i has ceil(n_i / BLOCK_Q) <= n_i // BLOCK_Q + 1 query blocks, and
    # sum_i n_i // BLOCK_Q <= (sum_i n_i) // BLOCK_Q, so num_tokens // BLOCK_Q + num_seqs covers every block
    # without reading query_start_loc on the host. Programs past a sequence's last block return at once.
    num_q_blocks = num_tokens // plan.block_q + num_seqs
    grid = (num_q_blocks, num_kv_heads, plan.num_kv_segments)
    split = plan.num_kv_segments > 1
    segm_out, segm_max, segm_sum = _segment_buffers(out, plan.num_kv_segments, head_dim_pad)
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
