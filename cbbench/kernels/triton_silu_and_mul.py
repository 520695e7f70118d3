"""Triton SiLU-and-mul (vLLM's `silu_and_mul`): the gate of a SwiGLU MLP over the merged gate_up projection.

x [num_tokens, 2 * d] holds gate in its first d columns and up in the last d (refengine.layers.linear.MergedLinear
`gate_up_proj`); out [num_tokens, d] = silu(gate) * up. One launch where torch runs two (silu on a strided view,
then the product), reading x once. Arithmetic as `silu_and_mul_ref`: silu(gate) = gate / (1 + exp(-gate)) in
float32 rounded to the model dtype, then the product rounded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cbbench.kernels.triton_common import FLOAT_DTYPES, cast_rne, check_launchable, is_interpreted, rows_per_program

BLOCK_D = 1024  # columns per program: a row of an 8B model's MLP (14336) takes 14 programs, each 4 per thread


DO_NOT_SPECIALIZE = ("num_rows",)  # changes from step to step (kernels/triton_rms_norm.py)


# A Triton program (untyped: see kernels/triton_rms_norm.py).
@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE)  # type: ignore[untyped-decorator]
def _silu_and_mul_kernel(  # type: ignore[no-untyped-def]
    x_ptr,  # [num_rows, 2 * D]   gate | up; last dim contiguous
    out_ptr,  # [num_rows, D]       last dim contiguous
    num_rows,
    stride_x,
    stride_out,
    D: tl.constexpr,
    BLOCK: tl.constexpr,  # columns per program
    ROWS: tl.constexpr,  # rows per program (triton_common.rows_per_program)
    INTERPRETED: tl.constexpr,  # round bf16 by hand (see cast_rne)
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # [ROWS, 1]
    cols = (tl.program_id(1) * BLOCK + tl.arange(0, BLOCK))[None, :]  # [1, BLOCK]
    mask = (rows < num_rows) & (cols < D)
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + rows * stride_x + D + cols, mask=mask, other=0.0).to(tl.float32)
    act = cast_rne(gate / (1.0 + tl.exp(-gate)), dtype, INTERPRETED).to(tl.float32)
    tl.store(out_ptr + rows * stride_out + cols, cast_rne(act * up, dtype, INTERPRETED), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] -> silu(x[:, :d]) * x[:, d:] [num_tokens, d], a new tensor (`silu_and_mul_ref`)."""
    if x.dim() != 2 or x.shape[1] % 2:
        raise ValueError(f"silu_and_mul: x must be [num_tokens, 2 * d], got {x.shape}")
    if x.stride(1) != 1:
        raise ValueError(f"silu_and_mul: x must be contiguous in its last dim, got strides {x.stride()}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"silu_and_mul: unsupported dtype {x.dtype}")
    d = x.shape[1] // 2
    out = torch.empty((x.shape[0], d), dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    check_launchable(_silu_and_mul_kernel, x.device)
    block = min(BLOCK_D, triton.next_power_of_2(d))
    rows = rows_per_program(_silu_and_mul_kernel, x.shape[0])
    _silu_and_mul_kernel[(triton.cdiv(x.shape[0], rows), triton.cdiv(d, block))](
        x, out, x.shape[0], x.stride(0), out.stride(0), D=d, BLOCK=block, ROWS=rows,
        INTERPRETED=is_interpreted(_silu_and_mul_kernel), num_warps=4,
    )  # fmt: skip
    return out
