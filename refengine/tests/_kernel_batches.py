"""What the Triton kernel tests (test_kernels.py) build and check: one step's attention inputs in vLLM's layout,
poisoned with NaN wherever a kernel must not read or write, a Hypothesis strategy of mixed steps, the comparison with
the torch oracle (kernels/reference.py) and its tolerances, and the `gpu` / needs-CUDA marks.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():  # before kernels is imported: Triton reads it when kernels are decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cbbench.kernels.reference import unified_attention_ref  # noqa: E402

# Error = max |kernel - oracle| / max |oracle| over the written elements.
# float32: both sides accumulate in fp32 (the kernel's dots use ieee, not tf32); only summation order differs,
# measured ~3e-7 here, so 1e-4 is far under the 1e-3 that a real indexing or masking bug produces.
FP32_REL_TOL = 1e-4
# bfloat16: same cache values, but bf16 keeps 8 significant bits, so one rounding of the output is 2^-8..2^-7
# relative, and on a GPU the softmax weights are also rounded to bf16 before the PV dot. (Under the interpreter
# the kernel computes in fp32 and rounds like the oracle: measured ~3e-6.)
BF16_REL_TOL = 1e-2

HYPOTHESIS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])  # the interpreter is slow
ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")


@dataclass(frozen=True)
class Batch:
    """One step's attention inputs (vLLM layout, see kernels/reference.py)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    scale: float

    def run(self, fn, **kwargs) -> torch.Tensor:
        out = torch.full_like(self.q, float("nan"))  # poison: an unwritten element stays NaN
        fn(self.q, self.k_cache, self.v_cache, out, self.query_start_loc, self.seq_lens, self.block_table,
           self.scale, **kwargs)  # fmt: skip
        return out

    def cpu(self) -> Batch:
        return Batch(*(t.cpu() if isinstance(t, torch.Tensor) else t for t in self.__dict__.values()))


def make_batch(
    seqs: list[tuple[int, int]],  # (query_len, context_len before this step) per sequence
    *,
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    seed: int,
    pad_tokens: int = 0,  # trailing tokens owned by no sequence (padded batch): the kernel must not write them
    device: str = DEVICE,
) -> Batch:
    g = torch.Generator().manual_seed(seed)
    seq_lens = [n + c for n, c in seqs]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 2  # two spare blocks nobody owns
    ids = torch.randperm(num_blocks, generator=g).to(torch.int32)
    width = max(blocks_per_seq) + 1  # one column past every sequence's need
    spare = ids[-1]
    block_table = torch.full((len(seqs), width), int(spare), dtype=torch.int32)  # unused columns -> a NaN block
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"))
    v_cache = torch.full(cache_shape, float("nan"))
    start = 0
    for i, (n_blocks, seq_len) in enumerate(zip(blocks_per_seq, seq_lens)):
        own = ids[start : start + n_blocks].long()
        start += n_blocks
        block_table[i, :n_blocks] = own.to(torch.int32)
        for kv in (k_cache, v_cache):  # real values in the sequence's slots only; its tail slots stay NaN
            vals = torch.randn(n_blocks * block_size, num_kv_heads, head_dim, generator=g)
            vals[seq_len:] = float("nan")
            kv[own] = vals.view(n_blocks, block_size, num_kv_heads, head_dim)
    num_tokens = sum(n for n, _ in seqs) + pad_tokens
    q = torch.randn(num_tokens, num_kv_heads * group, head_dim, generator=g)
    qsl = torch.tensor([0] + [n for n, _ in seqs], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    to = dict(device=device)
    return Batch(q.to(dtype).to(**to), k_cache.to(dtype).to(**to), v_cache.to(dtype).to(**to), qsl.to(**to),
                 torch.tensor(seq_lens, dtype=torch.int32, **to), block_table.to(**to), head_dim**-0.5)  # fmt: skip


def assert_matches_oracle(batch: Batch, out: torch.Tensor) -> None:
    ref = batch.cpu().run(unified_attention_ref)
    out = out.cpu()
    assert torch.equal(out.isnan(), ref.isnan()), "NaN pattern differs: an element unwritten, over-written or poisoned"
    ok = ~ref.isnan()
    tol = FP32_REL_TOL if batch.q.dtype == torch.float32 else BF16_REL_TOL
    err = ((out.float() - ref.float())[ok].abs().max() / ref.float()[ok].abs().max()).item()
    assert err < tol, f"relative error {err:.3g} >= {tol} ({batch.q.dtype})"


@st.composite
def batches(draw, max_seqs: int = 3, max_context: int = 80) -> Batch:
    """Mixed steps: decodes and prefill chunks whose context and length straddle block boundaries."""
    seqs = []
    for _ in range(draw(st.integers(1, max_seqs))):
        q_len = draw(st.one_of(st.just(1), st.integers(2, 40)))
        seqs.append((q_len, draw(st.integers(0, max_context))))
    kw = dict(
        num_kv_heads=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 4, 8])),
        head_dim=draw(st.sampled_from([64, 128])),
        block_size=draw(st.sampled_from([1, 16, 32])),
        dtype=draw(st.sampled_from([torch.float32, torch.bfloat16])),
        seed=draw(st.integers(0, 2**16)),
        pad_tokens=draw(st.sampled_from([0, 0, 2])),
    )
    return make_batch(seqs, **kw)
