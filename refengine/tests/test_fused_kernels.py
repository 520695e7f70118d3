"""The decoder layer's fused Triton kernels (kernels/triton_rms_norm.py, rotary_embedding.py, activation.py) against their
torch oracles (kernels/reference.py), their wrappers' checks, and the layers that pick between the two.

On a CPU the kernels run under TRITON_INTERPRET=1, on small shapes. Row counts cross the interpreter's rows per
program (triton_common.INTERPRETER_ROWS), so a tile's masked tail rows are exercised; inputs are strided views (as
the merged projections' outputs are) with NaN in the columns a kernel must neither read into its result nor write.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # before kernels is imported: Triton reads it when kernels are decorated
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from cbbench.kernels.reference import fused_add_rms_norm_ref, rms_norm_ref, rotary_embedding_ref, silu_and_mul_ref  # noqa: E402
from cbbench.kernels.triton_rms_norm import fused_add_rms_norm, rms_norm  # noqa: E402
from cbbench.kernels.triton_rope import rotary_embedding  # noqa: E402
from cbbench.kernels.triton_silu_and_mul import silu_and_mul  # noqa: E402
from refengine.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from refengine.models.model_config import rope_inv_freq  # noqa: E402
from refengine.models.presets import PRESETS  # noqa: E402
from refengine.tests._kernel_batches import DEVICE, HYPOTHESIS  # noqa: E402

# Error = max |kernel - oracle| / max |oracle|. Both sides round every intermediate alike (kernels/reference.py);
# what differs is the order of RMSNorm's sum of squares and, on a GPU, fused multiply-adds and the exp of SiLU:
# float32 ~1e-7 relative (measured 0 to 5e-7 here), so 1e-5 is far below the 1e-2 a wrong element or row gives.
FP32_REL_TOL = 1e-5
# bfloat16 keeps 8 significant bits: a different rstd in its last bit can move a rounded value by one ulp,
# 2^-8 relative (under the interpreter the results are in fact identical, measured).
BF16_REL_TOL = 2**-7
DTYPES = [torch.float32, torch.bfloat16]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert not actual.isnan().any(), "NaN: a masked or padded element leaked in"
    tol = FP32_REL_TOL if expected.dtype == torch.float32 else BF16_REL_TOL
    err = (actual.float() - expected.float()).abs().max().item()
    assert err <= tol * max(expected.float().abs().max().item(), 1e-6), err


def _strided(rows: int, cols: int, pad: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """[rows, cols] random, a view into [rows, cols + pad] whose last `pad` columns are NaN."""
    buf = torch.full((rows, cols + pad), float("nan"))
    buf[:, :cols] = torch.randn(rows, cols, generator=g)
    return buf.to(dtype).to(DEVICE)[:, :cols]


# ---------------------------------------------------------------- RMSNorm, alone and with the residual add

ROWS = st.sampled_from([1, 3, 17, 64, 70])  # 64 = INTERPRETER_ROWS; 70: a second, mostly masked tile


@given(
    num_tokens=ROWS,
    hidden=st.sampled_from([64, 96, 256]),  # 96: not a power of 2, a masked tail in the row's tile
    dtype=st.sampled_from(DTYPES),
    pad=st.sampled_from([0, 32]),
    seed=st.integers(0, 2**16),
)
@settings(HYPOTHESIS, max_examples=12)
def test_rms_norm_matches_oracle(num_tokens, hidden, dtype, pad, seed):
    g = torch.Generator().manual_seed(seed)
    x = _strided(num_tokens, hidden, pad, dtype, g)
    residual = _strided(num_tokens, hidden, pad, dtype, g)
    weight = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype).to(DEVICE)
    eps = 1e-6
    _assert_close(rms_norm(x, weight, eps), rms_norm_ref(x, weight, eps))

    want_out, want_residual = fused_add_rms_norm_ref(x, residual, weight, eps)
    x_in, residual_in = x.clone(), residual.clone()
    out, new_residual = fused_add_rms_norm(x_in, residual_in, weight, eps)
    assert out is x_in and new_residual is residual_in  # in place, as vLLM's
    assert torch.equal(new_residual, want_residual)  # one add, rounded once: exact
    _assert_close(out, want_out)


# ---------------------------------------------------------------- rotary embedding


@given(
    num_tokens=ROWS,
    num_heads=st.sampled_from([(1, 1), (4, 2), (14, 2)]),  # (q heads, kv heads): 16 and 3 heads rotated
    head_dim=st.sampled_from([16, 64, 128]),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
@settings(HYPOTHESIS, max_examples=12)
def test_rotary_embedding_matches_oracle(num_tokens, num_heads, head_dim, dtype, seed):
    """q and k rotated as one strided view of a merged qkv output, in place; v (after them) untouched."""
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads = num_heads
    max_position = 300
    rope = RotaryEmbedding(1.0 / (1e4 ** (torch.arange(0, head_dim, 2).float() / head_dim)), max_position)
    cache = rope.cos_sin_cache(torch.device(DEVICE), dtype)
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, generator=g).to(dtype).to(DEVICE)
    positions = torch.randint(0, max_position, (num_tokens,), generator=g).to(DEVICE)
    qk = qkv[:, : (heads + kv_heads) * head_dim].view(num_tokens, heads + kv_heads, head_dim)
    want = rotary_embedding_ref(positions, qk, cache)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    assert rotary_embedding(positions, qk, cache) is qk
    _assert_close(qk, want)
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], v_before)


def test_rotary_cache_is_llama31_scaled_and_rotates_like_hf():
    """The cos/sin cache comes from the config's (Llama-3.1 scaled) frequencies, and the oracle rotates as
    transformers' q * cos + rotate_half(q) * sin, bit for bit in bfloat16."""
    config = PRESETS["tiny-llama"]
    inv_freq = rope_inv_freq(config)
    assert config.rope_scaling is not None and not torch.equal(
        inv_freq, rope_inv_freq(config.replace(rope_scaling=None))
    )
    rope = RotaryEmbedding(inv_freq, config.max_position_embeddings)
    positions = torch.tensor([0, 5, 1023, 4095])
    x = torch.randn(4, 3, config.head_dim, generator=torch.Generator().manual_seed(0)).bfloat16()
    freqs = positions[:, None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().bfloat16()[:, None], emb.sin().bfloat16()[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    hf = x * cos + torch.cat((-x2, x1), dim=-1) * sin
    assert torch.equal(rotary_embedding_ref(positions, x, rope.cos_sin_cache(torch.device("cpu"), torch.bfloat16)), hf)


# ---------------------------------------------------------------- SiLU-and-mul


@given(
    num_tokens=ROWS,
    d=st.sampled_from([32, 96, 1100]),  # 1100 > BLOCK_D: two column blocks, the second masked
    dtype=st.sampled_from(DTYPES),
    pad=st.sampled_from([0, 16]),
    seed=st.integers(0, 2**16),
)
@settings(HYPOTHESIS, max_examples=10)
def test_silu_and_mul_matches_oracle(num_tokens, d, dtype, pad, seed):
    g = torch.Generator().manual_seed(seed)
    x = _strided(num_tokens, 2 * d, pad, dtype, g) * 3  # gate values well into silu's curved range
    _assert_close(silu_and_mul(x), silu_and_mul_ref(x))


# ---------------------------------------------------------------- the wrappers' checks


def test_wrappers_reject_bad_inputs():
    x, w = torch.zeros(4, 64), torch.ones(64)
    with pytest.raises(ValueError, match="weight \\[hidden\\]"):
        rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="share a float dtype"):
        rms_norm(x, w.bfloat16(), 1e-6)
    with pytest.raises(ValueError, match="contiguous in hidden"):
        rms_norm(x.t(), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="residual must match"):
        fused_add_rms_norm(x, torch.zeros(3, 64), w, 1e-6)
    with pytest.raises(ValueError, match="2 \\* d"):
        silu_and_mul(torch.zeros(4, 63))
    cache = torch.zeros(16, 64)
    with pytest.raises(ValueError, match="positions must be"):
        rotary_embedding(torch.zeros(3, dtype=torch.int64), torch.zeros(4, 2, 64), cache)
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        rotary_embedding(torch.zeros(4, dtype=torch.int64), torch.zeros(4, 2, 32), cache)
    with pytest.raises(ValueError, match="share a float dtype"):
        rotary_embedding(torch.zeros(4, dtype=torch.int64), torch.zeros(4, 2, 64).bfloat16(), cache)


def test_kernel_wrappers_format_messages_only_when_a_check_fails():
    """Every f-string in kernels/ is the message of a `raise`: a check that built its message first (as a helper
    taking it as an argument does) would format shapes and dtypes on every launch of every layer."""
    offenders = []
    for path in sorted((Path(__file__).resolve().parents[2] / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text())
        in_raise = {id(n) for r in ast.walk(tree) if isinstance(r, ast.Raise) for n in ast.walk(r)}
        offenders += [
            f"{path.name}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) and id(n) not in in_raise
        ]
    assert not offenders, offenders


# ---------------------------------------------------------------- the layers: Triton kernels or their oracles


def test_triton_backend_model_matches_torch_backend():
    """One model, the same weights, once on the fused Triton kernels (with the triton attention backend) and once
    on their oracles: the same logits, for a step mixing a prefill chunk and a decode."""
    from refengine.models.loader import build_random_model
    from refengine.tests._paged import PagedSequences

    config = PRESETS["tiny-llama"].replace(vocab_size=512, num_hidden_layers=2, eos_token_id=None)
    logits = {}
    for backend in ("torch", "triton"):
        model = build_random_model(config, seed=3, attention_backend=backend, device=DEVICE)
        assert model.use_triton_kernels == (backend == "triton")
        paged = PagedSequences(config, num_blocks=16, block_size=4, device=DEVICE)
        paged.forward(model, [(0, list(range(1, 10)))])
        logits[backend] = paged.forward(model, [(1, list(range(20, 27))), (0, [11])])  # a chunk and a decode
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=0)  # test_model.LOGITS_ATOL


# ---------------------------------------------------------------- GPU: real shapes, one row per program


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_fused_kernels_at_llama8b_shapes(dtype):
    """The compiled kernels at Llama-3.1-8B's shapes (hidden 4096, 32 + 8 heads of 128, intermediate 14336)."""
    g = torch.Generator().manual_seed(7)
    n, hidden, heads, head_dim, inter = 300, 4096, 40, 128, 14336
    x, residual = (torch.randn(n, hidden, generator=g).to(dtype).cuda() for _ in range(2))
    weight = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype).cuda()
    _assert_close(rms_norm(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    want_out, want_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-5)
    out, new_residual = fused_add_rms_norm(x.clone(), residual.clone(), weight, 1e-5)
    assert torch.equal(new_residual, want_residual)
    _assert_close(out, want_out)
    config = PRESETS["llama-3.1-8b"]
    rope = RotaryEmbedding(rope_inv_freq(config), config.max_position_embeddings)
    cache = rope.cos_sin_cache(torch.device("cuda"), dtype)
    qkv = torch.randn(n, (heads + 8) * head_dim, generator=g).to(dtype).cuda()
    qk = qkv[:, : heads * head_dim].view(n, heads, head_dim)
    positions = torch.randint(0, config.max_position_embeddings, (n,), generator=g).cuda()
    want = rotary_embedding_ref(positions, qk, cache)
    _assert_close(rotary_embedding(positions, qk, cache), want)
    gate_up = torch.randn(n, 2 * inter, generator=g).to(dtype).cuda() * 3
    _assert_close(silu_and_mul(gate_up), silu_and_mul_ref(gate_up))
