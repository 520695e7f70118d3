"""Triton RMSNorm, alone or fused with the residual add before it (vLLM's `rms_norm` and `fused_add_rms_norm`).

A decoder layer ends its attention and its MLP with `residual = residual + x` and starts the next block with
RMSNorm(residual): one program per token (rows_per_program) reads x and the residual once, writes the new residual and the normed
output, where the unfused torch code launches about ten kernels (cast, square, mean, add, rsqrt, two products, the
residual add) and reads the row each time.

Arithmetic as the oracle's (kernels/reference.py `rms_norm_ref`, `fused_add_rms_norm_ref`): the sum rounded to the
model dtype, the mean square in float32, the normed value rounded to the model dtype before the weight's product.
Only the order of the mean's summation differs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cbbench.kernels.triton_common import FLOAT_DTYPES, cast_rne, check_launchable, is_interpreted, rows_per_program

# num_rows changes from step to step: unspecialized, so a new step size compiles nothing (see
# kernels/unified_attention_kernels.py DO_NOT_SPECIALIZE). Every other int is fixed by the model.
DO_NOT_SPECIALIZE = ("num_rows",)


# A Triton program: Triton reads its parameter annotations (tl.constexpr), and its pointers and scalars have no
# Python type for mypy to check, so the decorator and the definition are left untyped (pyproject.toml [tool.mypy]).
@triton.jit(do_not_specialize=DO_NOT_SPECIALIZE)  # type: ignore[untyped-decorator]
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    x_ptr,  # [num_rows, hidden]            last dim contiguous
    residual_ptr,  # [num_rows, hidden]     HAS_RESIDUAL: read, and overwritten with x + residual
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]          the normed rows (may be x itself: each row is read before written)
    num_rows,
    stride_x,
    stride_residual,
    stride_out,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,  # next power of 2 of HIDDEN: a whole row in one tile
    ROWS: tl.constexpr,  # rows per program (triton_common.rows_per_program)
    HAS_RESIDUAL: tl.constexpr,
    INTERPRETED: tl.constexpr,  # round bf16 by hand (see cast_rne)
):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)[:, None]  # [ROWS, 1]
    cols = tl.arange(0, BLOCK)[None, :]  # [1, BLOCK]
    mask = (rows < num_rows) & (cols < HIDDEN)
    dtype = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + rows * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + rows * stride_residual + cols
        s = cast_rne(x + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32), dtype, INTERPRETED)
        tl.store(r_ptrs, s, mask=mask)
        x = s.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)  # [ROWS]
    normed = cast_rne(x * rstd[:, None], dtype, INTERPRETED).to(tl.float32)
    w = tl.load(weight_ptr + cols, mask=cols < HIDDEN, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows * stride_out + cols, cast_rne(normed * w, dtype, INTERPRETED), mask=mask)


def _launch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, eps: float, has_residual: bool
) -> None:
    num_rows, hidden = x.shape
    check_launchable(_rms_norm_kernel, x.device)
    block = triton.next_power_of_2(hidden)
    rows = rows_per_program(_rms_norm_kernel, num_rows)
    _rms_norm_kernel[(triton.cdiv(num_rows, rows),)](
        x, residual, weight, out, num_rows, x.stride(0), residual.stride(0), out.stride(0), eps,
        HIDDEN=hidden, BLOCK=block, ROWS=rows, HAS_RESIDUAL=has_residual,
        INTERPRETED=is_interpreted(_rms_norm_kernel), num_warps=_num_warps(block),
    )  # fmt: skip


def _num_warps(block: int) -> int:
    # about 8 elements of the row per thread, between one warp and 16 (a 8192-wide row: 16 warps x 32 x 16)
    return min(16, max(1, block // 256))


def _check_rows(x: torch.Tensor, weight: torch.Tensor, name: str) -> None:
    """x [num_tokens, hidden] contiguous in hidden, weight [hidden] contiguous, one dtype and device."""
    if x.dim() != 2 or weight.dim() != 1 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"{name}: x must be [num_tokens, hidden] and weight [hidden], got {x.shape} / {weight.shape}")
    if x.stride(1) != 1 or weight.stride(0) != 1:
        raise ValueError(
            f"{name}: x and weight must be contiguous in hidden, got strides {x.stride()} / {weight.stride()}"
        )
    if x.dtype not in FLOAT_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"{name}: x and weight must share a float dtype, got {x.dtype} / {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"{name}: x and weight are on {x.device} / {weight.device}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [num_tokens, hidden] into a new tensor (`rms_norm_ref`)."""
    _check_rows(x, weight, "rms_norm")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0] == 0:
        return out
    _launch(x, x, weight, out, eps, has_residual=False)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place, as vLLM's: residual <- x + residual, x <- RMSNorm(x + residual); returns (x, residual), the
    normed output and the new residual (`fused_add_rms_norm_ref`, which returns new tensors instead)."""
    _check_rows(x, weight, "fused_add_rms_norm")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            "fused_add_rms_norm: residual must match x in shape, dtype and device, got "
            f"{residual.shape} {residual.dtype} {residual.device} / {x.shape} {x.dtype} {x.device}"
        )
    if residual.stride(1) != 1:
        raise ValueError(f"fused_add_rms_norm: residual must be contiguous in hidden, got strides {residual.stride()}")
    if x.shape[0] == 0:
        return x, residual
    _launch(x, residual, weight, x, eps, has_residual=True)
    return x, residual
