"""The `torch` attention backend (refengine.layers.attention.unified_attention_cpu: chunked decode attention, the oracle
for prefill chunks) against the oracle (cbbench.kernels.reference.unified_attention_ref).

Batches are built to catch a wrong gather or mask: block tables are random permutations, cache blocks no sequence
owns and the slots past each sequence's end hold NaN, `out` is NaN before the call, and decode lengths straddle the
backend's key chunks (DECODE_CHUNK_TOKENS) and block boundaries, so a chunk that reads a slot it should not, or a
row left unwritten, shows up as NaN.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cbbench.kernels.reference import unified_attention_ref
from refengine.layers.attention import DECODE_CHUNK_TOKENS, get_attention_backend, unified_attention_cpu

# max |backend - oracle| / max |oracle|: both compute in float32 and differ only in summation order (the online
# softmax across chunks), measured ~3e-7 here; a wrong mask or gather is off by far more than 1e-4.
FP32_REL_TOL = 1e-4
# bfloat16 caches and queries: both sides compute in float32 from the same bf16 values, but each rounds its output
# to bf16 (8 significant bits), so one rounding step apart is 2^-8..2^-7 relative
BF16_REL_TOL = 1e-2


def make_batch(
    seqs: list[tuple[int, int]],
    *,
    kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    seed: int,
    pad_tokens: int = 0,
) -> tuple:
    """seqs: (query_len, context before this step) -> (q, k_cache, v_cache, qsl, seq_lens, block_table, scale)."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [n + c for n, c in seqs]
    blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks) + 1  # one spare block nobody owns
    ids = torch.randperm(num_blocks, generator=g)
    table = torch.full((len(seqs), max(blocks) + 1), int(ids[-1]), dtype=torch.int32)  # unused: the NaN block
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache, v_cache = torch.full(shape, float("nan")), torch.full(shape, float("nan"))
    start = 0
    for i, (nb, n) in enumerate(zip(blocks, seq_lens)):
        own = ids[start : start + nb]
        start += nb
        table[i, :nb] = own.to(torch.int32)
        for cache in (k_cache, v_cache):  # real values in the sequence's slots; its tail slots stay NaN
            vals = torch.randn(nb * block_size, kv_heads, head_dim, generator=g)
            vals[n:] = float("nan")
            cache[own] = vals.view(nb, block_size, kv_heads, head_dim)
    q = torch.randn(sum(n for n, _ in seqs) + pad_tokens, kv_heads * group, head_dim, generator=g)
    qsl = torch.tensor([0] + [n for n, _ in seqs]).cumsum(0).to(torch.int32)
    return q, k_cache, v_cache, qsl, torch.tensor(seq_lens, dtype=torch.int32), table, head_dim**-0.5


def run(fn, batch: tuple, host_lens: bool) -> torch.Tensor:
    q, k_cache, v_cache, qsl, seq_lens, table, scale = batch
    out = torch.full_like(q, float("nan"))  # poison: an unwritten element stays NaN
    kw = {"query_start_loc_cpu": qsl.tolist(), "seq_lens_cpu": seq_lens.tolist()} if host_lens else {}
    fn(q, k_cache, v_cache, out, qsl, seq_lens, table, scale, **kw)
    return out


def assert_matches_oracle(batch: tuple, host_lens: bool = True, dtype: torch.dtype = torch.float32) -> None:
    batch = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch[:3]) + batch[3:]
    ref = run(unified_attention_ref, batch, host_lens).float()
    out = run(unified_attention_cpu, batch, host_lens).float()
    assert torch.equal(out.isnan(), ref.isnan()), "NaN pattern differs: an element unwritten, over-written or poisoned"
    ok = ~ref.isnan()
    err = ((out - ref)[ok].abs().max() / ref[ok].abs().max()).item()
    tol = FP32_REL_TOL if dtype == torch.float32 else BF16_REL_TOL
    assert err < tol, f"relative error {err:.3g} >= {tol} ({dtype})"


@st.composite
def batches(draw) -> tuple:
    """Many decodes of lengths across several key chunks, with some prefill chunks and padding mixed in."""
    longest = 3 * DECODE_CHUNK_TOKENS
    seqs = [(1, draw(st.integers(0, longest))) for _ in range(draw(st.integers(1, 12)))]
    for _ in range(draw(st.integers(0, 2))):
        seqs.insert(draw(st.integers(0, len(seqs))), (draw(st.integers(2, 20)), draw(st.integers(0, 40))))
    return make_batch(
        seqs,
        kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 2, 4])),
        head_dim=draw(st.sampled_from([16, 64])),
        block_size=draw(st.sampled_from([1, 16, 32])),
        seed=draw(st.integers(0, 2**16)),
        pad_tokens=draw(st.sampled_from([0, 0, 2])),
    )


@given(batch=batches(), host_lens=st.booleans(), dtype=st.sampled_from([torch.float32, torch.float32, torch.bfloat16]))
@settings(deadline=None, max_examples=60)
def test_cpu_backend_matches_oracle(batch, host_lens, dtype):
    assert_matches_oracle(batch, host_lens, dtype)


def test_decodes_of_equal_and_chunk_boundary_lengths():
    """Lengths exactly at chunk and block boundaries, and ties (the sort must keep each row its own)."""
    c = DECODE_CHUNK_TOKENS
    lens = [c - 1, c, c + 1, 2 * c, 1, 1, c, 2 * c - 1]  # context before the step; +1 with the decoded token
    assert_matches_oracle(make_batch([(1, n) for n in lens], kv_heads=2, group=2, head_dim=64, block_size=16, seed=3))


def test_torch_backend_is_the_cpu_path():
    assert get_attention_backend("torch").unified_attention is unified_attention_cpu
