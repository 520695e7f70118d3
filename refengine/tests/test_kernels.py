"""Triton kernels (kernels) against the torch oracle (kernels/reference.py), and the kernel benchmark's CSV.

On a CPU they run under TRITON_INTERPRET=1 (slow: shapes stay tiny); `gpu`-marked tests run larger shapes and the
bf16 tensor-core path on CUDA. Every batch is built to catch a wrong gather: block tables are random permutations,
cache blocks no sequence owns and slots past a sequence's end hold NaN, and `out` is NaN before each call, so a
stray read or an unwritten element shows up as NaN.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before kernels is imported: Triton reads it when kernels are decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cbbench.kernels.reference import reshape_and_cache_ref
from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache  # noqa: E402
from cbbench.kernels.triton_unified_attention import (  # noqa: E402
    MAX_KV_SEGMENTS,
    choose_num_kv_segments,
    plan_unified_attention,
    unified_attention,
)
from refengine.tests._kernel_batches import (  # noqa: E402
    DEVICE,
    HYPOTHESIS,
    assert_matches_oracle,
    batches,
    gpu,
    make_batch,
    needs_cuda,
)

# ---------------------------------------------------------------- reshape_and_cache


@given(
    num_tokens=st.integers(1, 24),
    num_kv_heads=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([64, 128]),
    block_size=st.sampled_from([1, 16, 32]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    fused=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(HYPOTHESIS, max_examples=12)
def test_reshape_and_cache_matches_oracle(num_tokens, num_kv_heads, head_dim, block_size, dtype, fused, seed):
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    padding = torch.rand(num_tokens, generator=g) < 0.25
    slot_mapping = torch.where(padding, -1, slots).to(DEVICE)
    if fused:  # k, v as strided views of one fused [num_tokens, 2 * kvH * D] projection, as a model produces them
        kv = torch.randn(num_tokens, 2 * num_kv_heads * head_dim, generator=g).to(dtype).to(DEVICE)
        k, v = (t.view(num_tokens, num_kv_heads, head_dim) for t in kv.chunk(2, dim=1))
        assert num_tokens == 1 or k.stride(0) == 2 * num_kv_heads * head_dim  # a row stride the kernel must honour
    else:
        k, v = (torch.randn(num_tokens, num_kv_heads, head_dim, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = (torch.randn(shape, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    before = (k_cache.clone(), v_cache.clone())
    want_k, want_v = k_cache.clone(), v_cache.clone()
    reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)
    reshape_and_cache_ref(k, v, want_k, want_v, slot_mapping)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)  # a store is exact, bf16 included
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    untouched[slot_mapping[slot_mapping >= 0]] = False
    for cache, orig in zip((k_cache, v_cache), before):  # padding and unmapped slots keep their old values
        assert torch.equal(cache.flatten(0, 1)[untouched], orig.flatten(0, 1)[untouched])


def test_reshape_and_cache_rejects_bad_inputs():
    k = torch.zeros(4, 2, 64)
    cache = torch.zeros(3, 16, 2, 64)
    slots = torch.arange(4)
    with pytest.raises(ValueError, match="dtypes must match"):
        reshape_and_cache(k, k, cache.bfloat16(), cache.bfloat16(), slots)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        reshape_and_cache(k, k, cache, cache, slots[:3])
    with pytest.raises(ValueError, match="contiguous in head_dim"):
        reshape_and_cache(k.transpose(1, 2).contiguous().transpose(1, 2), k, cache, cache, slots)


# ---------------------------------------------------------------- unified_attention


@given(batch=batches())
@settings(HYPOTHESIS, max_examples=14)
def test_unified_attention_matches_oracle(batch):
    assert_matches_oracle(batch, batch.run(unified_attention))


@pytest.mark.slow  # the forced split-KV path under the Triton interpreter, about 45 s: nightly
@given(batch=batches(max_seqs=2, max_context=120), num_kv_segments=st.sampled_from([2, 4, 8]))
@settings(HYPOTHESIS, max_examples=6)
def test_split_kv_forced_matches_oracle(batch, num_kv_segments):
    """Split-KV on any batch, mixed ones too; more segments than tiles leaves some empty (weight 0 in the reduce)."""
    assert_matches_oracle(batch, batch.run(unified_attention, num_kv_segments=num_kv_segments))


def test_split_kv_chosen_by_heuristic_for_long_decodes():
    batch = make_batch([(1, 200), (1, 57)], num_kv_heads=1, group=4, head_dim=64, block_size=16,
                       dtype=torch.bfloat16, seed=1)  # fmt: skip
    plan = plan_unified_attention(batch.q, batch.k_cache, batch.block_table, num_seqs=2)
    assert plan.num_kv_segments > 1
    assert_matches_oracle(batch, batch.run(unified_attention))


def test_prefill_tile_of_64_rows_matches_oracle():
    """The GPU's prefill tile (block_m=64, so 64 // G tokens per program) through the interpreter."""
    batch = make_batch([(37, 20), (1, 40), (9, 0)], num_kv_heads=2, group=4, head_dim=64, block_size=16,
                       dtype=torch.float32, seed=2)  # fmt: skip
    assert_matches_oracle(batch, batch.run(unified_attention, block_m=64))


def test_choose_num_kv_segments():
    kw = dict(tile_n=64, num_sms=132)
    assert choose_num_kv_segments(num_seqs=4, num_tokens=9, num_kv_heads=8, max_seqlen_k=8192, **kw) == 1  # prefill
    assert choose_num_kv_segments(num_seqs=64, num_tokens=64, num_kv_heads=8, max_seqlen_k=8192, **kw) == 1  # full
    assert choose_num_kv_segments(num_seqs=4, num_tokens=4, num_kv_heads=8, max_seqlen_k=128, **kw) == 1  # short
    assert choose_num_kv_segments(num_seqs=4, num_tokens=4, num_kv_heads=8, max_seqlen_k=8192, **kw) == 8
    assert (
        choose_num_kv_segments(num_seqs=1, num_tokens=1, num_kv_heads=1, max_seqlen_k=1 << 20, **kw) == MAX_KV_SEGMENTS
    )
    n = choose_num_kv_segments(num_seqs=3, num_tokens=3, num_kv_heads=4, max_seqlen_k=4096, **kw)
    assert n & (n - 1) == 0


def test_unified_attention_rejects_bad_inputs():
    b = make_batch([(1, 5)], num_kv_heads=2, group=2, head_dim=64, block_size=16, dtype=torch.float32, seed=0)
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        unified_attention(b.q[:, :3], b.k_cache, b.v_cache, b.q[:, :3].clone(), b.query_start_loc, b.seq_lens,
                          b.block_table, b.scale)  # fmt: skip
    with pytest.raises(ValueError, match="dtypes differ"):
        unified_attention(b.q.bfloat16(), b.k_cache, b.v_cache, b.q.bfloat16(), b.query_start_loc, b.seq_lens,
                          b.block_table, b.scale)  # fmt: skip
    with pytest.raises(ValueError, match="query_start_loc must be"):
        unified_attention(b.q, b.k_cache, b.v_cache, b.q.clone(), b.query_start_loc[:1], b.seq_lens, b.block_table,
                          b.scale)  # fmt: skip
    with pytest.raises(ValueError, match="num_kv_segments must be a power of 2"):
        b.run(unified_attention, num_kv_segments=3)


# ---------------------------------------------------------------- GPU: real shapes, bf16 tensor cores


@gpu
@needs_cuda
@pytest.mark.parametrize("num_heads,num_kv_heads", [(28, 4), (32, 8)])  # Qwen2.5-7B, Llama-3.1-8B
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_kv_segments", [None, 1, 4])
def test_gpu_mixed_batch_real_shapes(num_heads, num_kv_heads, dtype, num_kv_segments):
    seqs = [(1, 3000), (1, 17), (300, 700), (1, 1023), (64, 0), (1, 511)]
    batch = make_batch(seqs, num_kv_heads=num_kv_heads, group=num_heads // num_kv_heads, head_dim=128,
                       block_size=16, dtype=dtype, seed=3, device="cuda")  # fmt: skip
    assert_matches_oracle(batch, batch.run(unified_attention, num_kv_segments=num_kv_segments))


@gpu
@needs_cuda
@pytest.mark.parametrize("block_size", [16, 32])
def test_gpu_decode_heavy_takes_split_kv(block_size):
    seqs = [(1, 4000 + 37 * i) for i in range(4)]
    batch = make_batch(seqs, num_kv_heads=4, group=7, head_dim=128, block_size=block_size, dtype=torch.bfloat16,
                       seed=4, device="cuda")  # fmt: skip
    assert plan_unified_attention(batch.q, batch.k_cache, batch.block_table, num_seqs=4).num_kv_segments > 1
    assert_matches_oracle(batch, batch.run(unified_attention))


@gpu
@needs_cuda
def test_gpu_reshape_and_cache_bf16_large():
    g = torch.Generator().manual_seed(5)
    k, v = (torch.randn(4096, 8, 128, generator=g).bfloat16().cuda() for _ in range(2))
    k_cache, v_cache = (torch.randn(600, 16, 8, 128).bfloat16().cuda() for _ in range(2))
    slot_mapping = torch.randperm(600 * 16, generator=g)[:4096].cuda()
    slot_mapping[::7] = -1
    want = (k_cache.clone(), v_cache.clone())
    reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)
    reshape_and_cache_ref(k, v, *want, slot_mapping)
    assert torch.equal(k_cache, want[0]) and torch.equal(v_cache, want[1])


# ---------------------------------------------------------------- the kernel benchmark's bookkeeping


def test_kernel_bench_smoke_csv(tmp_path):
    from cbbench.perf.bench.kernels import BenchShape, attention_bytes, run_kernel_bench

    shape = BenchShape("toy", "mixed", num_heads=4, num_kv_heads=2, head_dim=64, batch=3, context=40, prefill_len=8)
    # 2 decodes (seq_len 41) + a chunk of 8 on a context of 40 (seq_len 48): K and V of 2 * 41 + 48 positions;
    # Q and out of 2 + 8 tokens
    assert attention_bytes(shape, dtype_bytes=2) == (2 * 41 + 48) * 2 * 64 * 2 * 2 + 10 * 4 * 64 * 2 * 2
    out_csv = tmp_path / "kernels.csv"
    df = run_kernel_bench(str(out_csv), quick=True, allow_cpu=True)
    back = pd.read_csv(out_csv)
    assert len(back) == len(df) > 0
    for col in ("model", "kind", "batch", "context", "triton_ms", "bytes", "triton_gbps", "frac_of_hbm", "sdpa_ms"):
        assert col in back.columns
    assert (back["triton_ms"] > 0).all() and (back["bytes"] > 0).all()
