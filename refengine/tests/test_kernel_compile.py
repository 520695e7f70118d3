"""The compiled (GPU) path of the Triton kernels (attention, KV store and the decoder layer's fused kernels), without
a GPU: each kernel variant compiled to an sm_90 cubin with Triton's bundled ptxas, in a process where
TRITON_INTERPRET is off, must compile and must not spill registers. (Their results against the oracle are
test_kernels.py's and test_fused_kernels.py's job.)
"""

from __future__ import annotations

import os

import pytest

# ---------------------------------------------------------------- the compiled (GPU) path, without a GPU


def compile_for_sm90() -> list[str]:
    """Compile the non-interpreted kernels to sm_90 cubins with Triton's bundled ptxas (no device needed) and
    return, per variant, its resource line: catches GPU-only compile errors and register spills on a CPU box.
    Must run in a process where TRITON_INTERPRET was unset when kernels was imported."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from cbbench.kernels.triton_reshape_and_cache import _reshape_and_cache_kernel
    from cbbench.kernels.triton_rms_norm import _rms_norm_kernel
    from cbbench.kernels.triton_rope import _rotary_embedding_kernel
    from cbbench.kernels.triton_silu_and_mul import _silu_and_mul_kernel
    from cbbench.kernels.triton_unified_attention import _reduce_segments_kernel, _unified_attention_kernel

    ptr = {"q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr", "k_ptr", "v_ptr", "x_ptr", "residual_ptr", "weight_ptr",
           "cos_sin_cache_ptr"}  # fmt: skip
    fp32_ptr = {"segm_out_ptr", "segm_max_ptr", "segm_sum_ptr"}
    # per-step ints (do_not_specialize) and float scalars: no divisibility hint
    unaligned = {"num_seqs", "num_heads", "qk_scale", "stride_bt_seq", "num_rows", "num_tokens", "eps"}

    def build(fn, dtype: str, consts: dict, num_warps: int = 4) -> str:
        sig = {
            n: "constexpr"
            if n in consts
            else f"*{dtype}"
            if n in ptr
            else "*fp32"
            if n in fp32_ptr
            else "*i64"
            if n == "positions_ptr"  # (the runner's positions are int64)
            else "*i32"
            if n.endswith("_ptr")
            else "fp32"
            if n in ("qk_scale", "eps")
            else "i32"
            for n in fn.arg_names
        }
        # as the JIT does for 16-aligned pointers and strides (num_seqs/num_heads/block-table stride: any value)
        aligned = [i for i, n in enumerate(fn.arg_names) if n not in consts and n not in unaligned]
        src = ASTSource(fn, sig, consts, attrs={(i,): [["tt.divisibility", 16]] for i in aligned})
        cubin = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["cubin"]
        tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        return f"{fn.__name__} {dtype} {consts} " + " ".join(re.findall(r"(?:REG|STACK|LOCAL):\d+", usage))  # fmt: skip

    common = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, BLOCK_SIZE=16, UPCAST=False, INTERPRETED=False)
    return [
        build(_unified_attention_kernel, "bf16", dict(common, NUM_QUERIES_PER_KV=7, BLOCK_Q=2, BLOCK_M=16, TILE_N=64,
                                                      NUM_SEGMENTS=8, DOT_PRECISION=None)),
        build(_unified_attention_kernel, "bf16", dict(common, NUM_QUERIES_PER_KV=8, BLOCK_Q=8, BLOCK_M=64, TILE_N=64,
                                                      NUM_SEGMENTS=1, DOT_PRECISION=None)),
        build(_unified_attention_kernel, "fp32", dict(common, NUM_QUERIES_PER_KV=4, BLOCK_Q=4, BLOCK_M=16, TILE_N=32,
                                                      NUM_SEGMENTS=1, DOT_PRECISION="ieee")),
        build(_reduce_segments_kernel, "bf16", dict(HEAD_DIM=128, HEAD_DIM_PAD=128, NUM_SEGMENTS=8, INTERPRETED=False)),
        build(_reshape_and_cache_kernel, "bf16", dict(NUM_KV_HEADS=4, HEAD_DIM=128, HEADS_PAD=4, HEAD_DIM_PAD=128,
                                                      BLOCK_SIZE=16)),
        # the decoder layer's fused kernels at Llama-3.1-8B's shapes, one row per program, the wrappers' warps
        build(_rms_norm_kernel, "bf16", dict(HIDDEN=4096, BLOCK=4096, ROWS=1, HAS_RESIDUAL=True, INTERPRETED=False),
              num_warps=16),
        build(_rotary_embedding_kernel, "bf16", dict(NUM_HEADS=40, HALF=64, HEADS_PAD=64, HALF_PAD=64, ROWS=1,
                                                     INTERPRETED=False)),
        build(_silu_and_mul_kernel, "bf16", dict(D=14336, BLOCK=1024, ROWS=1, INTERPRETED=False)),
    ]  # fmt: skip


def test_kernels_compile_for_sm90_without_spills():
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import test_kernel_compile; print(*test_kernel_compile.compile_for_sm90(), sep='\\n')"
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    if run.returncode != 0 and ("ModuleNotFoundError" in run.stderr or "ImportError" in run.stderr):
        pytest.skip(f"this Triton build cannot compile ahead of time here: {run.stderr.strip().splitlines()[-1]}")
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 8
    for line in lines:
        assert "STACK:0" in line and "LOCAL:0" in line, f"register spills: {line}"
