"""Host side of the Triton kernels: a light import (the torch backend never loads Triton), `do_not_specialize` on
the per-step ints, and a warm-up that launches every variant the launch heuristics can pick.

The kernels' results against the oracle are refengine/tests/test_kernels.py's job (under TRITON_INTERPRET=1 on a CPU).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import torch

if not torch.cuda.is_available():  # before kernels' Triton modules load (see conformance/_triton_env.py)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ON_GPU = torch.cuda.is_available()


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )


def test_torch_backend_never_imports_triton() -> None:
    res = _run("""
        import sys
        import refengine
        from refengine import LLMEngine, SamplingParams
        import cbbench.kernels, cbbench.kernels.reference
        assert "triton" not in sys.modules, "import"
        engine = LLMEngine("tiny-qwen2", device="cpu", attention_backend="torch", num_gpu_blocks=64)
        engine.add_request("r", "Hello there", SamplingParams(max_tokens=3))
        while engine.has_unfinished_requests():
            engine.step()
        assert "triton" not in sys.modules, sorted(m for m in sys.modules if "triton" in m or "dynamo" in m)
        print("ok")
    """)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def _do_not_specialize(kernel, what: str = "do_not_specialize") -> list:
    """The names (or indices) given to triton.jit(do_not_specialize=...) (or `what`), compiled or interpreted."""
    if hasattr(kernel, what):
        return list(getattr(kernel, what))
    return list(kernel.kwargs.get(what) or [])


def test_per_step_ints_are_not_specialized() -> None:
    from cbbench.kernels.triton_unified_attention import _reduce_segments_kernel, _unified_attention_kernel
    from cbbench.kernels.unified_attention_kernels import DO_NOT_SPECIALIZE

    assert {"num_seqs", "stride_bt_seq"} <= set(DO_NOT_SPECIALIZE)
    for kernel, names in (
        (_unified_attention_kernel, {"num_seqs", "stride_bt_seq"}),
        (_reduce_segments_kernel, {"num_seqs"}),
    ):
        given = set(_do_not_specialize(kernel))
        assert names <= given
        # Triton ignores a name that is no parameter: a typo would silently specialize again
        assert given <= set(inspect.signature(kernel.fn).parameters)
        if hasattr(kernel, "params"):  # compiled (GPU): the flag reached the parameter itself
            flags = {p.name: p.do_not_specialize for p in kernel.params}
            assert all(flags[n] for n in names)


def test_fused_kernels_row_count_is_not_specialized() -> None:
    """The decoder layer's fused kernels take the step's row count as their one per-step int."""
    from cbbench.kernels.triton_rms_norm import _rms_norm_kernel
    from cbbench.kernels.triton_rope import _rotary_embedding_kernel
    from cbbench.kernels.triton_silu_and_mul import _silu_and_mul_kernel

    for kernel, name in (
        (_rms_norm_kernel, "num_rows"),
        (_silu_and_mul_kernel, "num_rows"),
        (_rotary_embedding_kernel, "num_tokens"),
    ):
        given = set(_do_not_specialize(kernel))
        assert given == {name} and name in inspect.signature(kernel.fn).parameters


def test_layer_warmup_launches_each_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    import cbbench.kernels.warmup as warmup_mod

    launched = []
    for name in ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "silu_and_mul"):
        real = getattr(warmup_mod, name)
        monkeypatch.setattr(
            warmup_mod, name, lambda *a, _real=real, _name=name, **k: (launched.append(_name), _real(*a, **k))[1]
        )
    warmup_mod.warmup_layer_kernels(64, 4, 2, 16, 96, torch.float32, "cuda" if ON_GPU else "cpu")
    assert sorted(launched) == ["fused_add_rms_norm", "rms_norm", "rotary_embedding", "silu_and_mul"]


def test_slot_mapping_pointer_alignment_is_not_specialized() -> None:
    """slot_mapping may be a view into a packed per-step buffer: its alignment must not pick a kernel variant."""
    import triton

    from cbbench.kernels.triton_reshape_and_cache import _reshape_and_cache_kernel

    if "do_not_specialize_on_alignment" not in inspect.signature(triton.jit).parameters:
        pytest.skip("this Triton has no do_not_specialize_on_alignment")
    given = _do_not_specialize(_reshape_and_cache_kernel, "do_not_specialize_on_alignment")
    assert "slot_mapping_ptr" in given and set(given) <= set(inspect.signature(_reshape_and_cache_kernel.fn).parameters)


def test_warmup_covers_every_variant_the_heuristics_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    import cbbench.kernels.warmup as warmup_mod
    from cbbench.kernels.triton_unified_attention import plan_unified_attention

    heads, kv_heads, head_dim, block_size, max_model_len = 4, 2, 16, 4, 256
    dtype, device = torch.float32, "cuda" if ON_GPU else "cpu"
    launched = []
    real = warmup_mod.unified_attention

    def spy(q, *args, **kwargs):
        launched.append((q.shape[0] > 1, kwargs["block_m"], kwargs["num_kv_segments"]))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(warmup_mod, "unified_attention", spy)
    variants = warmup_mod.warmup_attention_kernels(heads, kv_heads, head_dim, block_size, dtype, max_model_len, device)
    assert launched == [(v.prefill, v.block_m, v.num_kv_segments) for v in variants]
    # every (decode-only | prefill) batch up to 8 sequences and every block-table width gets a warmed-up plan
    k_cache = torch.empty(1, block_size, kv_heads, head_dim, dtype=dtype, device=device)
    picked = set()
    for num_seqs in range(1, 9):
        for width in range(1, max_model_len // block_size + 1):
            table = torch.zeros(num_seqs, width, dtype=torch.int32, device=device)
            for num_tokens in (num_seqs, num_seqs + 3):
                q = torch.empty(num_tokens, heads, head_dim, dtype=dtype, device=device)
                plan = plan_unified_attention(q, k_cache, table, num_seqs)
                picked.add((num_tokens > num_seqs, plan.block_m, plan.num_kv_segments))
    assert picked == set(launched)
    assert any(seg > 1 for _, _, seg in picked)  # the split-KV path is among them at these shapes


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
def test_gpu_no_compile_after_engine_start() -> None:
    """After the engine's warm-up, steps of any batch size and context length compile nothing new."""
    from cbbench.kernels.triton_reshape_and_cache import _reshape_and_cache_kernel
    from cbbench.kernels.triton_rms_norm import _rms_norm_kernel
    from cbbench.kernels.triton_rope import _rotary_embedding_kernel
    from cbbench.kernels.triton_silu_and_mul import _silu_and_mul_kernel
    from cbbench.kernels.triton_unified_attention import _reduce_segments_kernel, _unified_attention_kernel
    from refengine import LLM, SamplingParams

    kernels = (
        _unified_attention_kernel,
        _reduce_segments_kernel,
        _reshape_and_cache_kernel,
        _rms_norm_kernel,
        _rotary_embedding_kernel,
        _silu_and_mul_kernel,
    )

    def compiled() -> int:
        return sum(len(c[0]) for k in kernels for c in k.device_caches.values())

    # eager: every decode batch size goes through the kernels themselves, not a captured graph
    with LLM(model="qwen2.5-0.5b", device="cuda", max_model_len=4096, num_gpu_blocks=4096, enforce_eager=True) as llm:
        start = compiled()
        assert start > 0
        for n, out_len in ((1, 40), (3, 17), (37, 9), (130, 5)):
            prompts = [[100 + i + j for j in range(5 + 31 * i % 300)] for i in range(n)]
            llm.generate(prompts, SamplingParams(max_tokens=out_len, ignore_eos=True))
        assert compiled() == start
