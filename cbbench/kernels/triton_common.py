"""What every Triton kernel here and its Python wrapper share: whether a kernel runs in Triton's interpreter,
whether it can launch on a device, and the rounding to a 16-bit dtype that the interpreter gets wrong.

The wrappers check their arguments before each launch with plain `if ...: raise ValueError(f"...")`: the message is
formatted only when a check fails. (A helper taking the message as an argument would format every check's
f-string, shapes and all, on every call: host time in every layer of every step.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def is_interpreted(kernel: object) -> bool:
    """Whether `kernel` was decorated under TRITON_INTERPRET=1 (decoration time is what counts, not the env now)."""
    return type(kernel).__name__ == "InterpretedFunction"


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what the kernels compute in and store
INDEX_DTYPES = (torch.int32, torch.int64)  # slot mappings, positions, query_start_loc, seq_lens, block tables

# Rows (tokens) per program of the row-wise kernels (layernorm, rotary embedding, SiLU-and-mul). On a GPU one row
# per program, as vLLM's; the interpreter runs programs one after another at a fixed cost each (milliseconds), so
# there one program takes a tile of up to this many rows and an engine step under TRITON_INTERPRET stays quick.
INTERPRETER_ROWS = 64


def rows_per_program(kernel: object, num_rows: int) -> int:
    """1 on a GPU; a power of 2 up to INTERPRETER_ROWS under the interpreter (see INTERPRETER_ROWS)."""
    if not is_interpreted(kernel):
        return 1
    rows: int = triton.next_power_of_2(max(num_rows, 1))
    return min(INTERPRETER_ROWS, rows)


def check_launchable(kernel: object, device: torch.device) -> None:
    """A compiled Triton kernel needs CUDA tensors; on a CPU machine only the interpreter can run it."""
    if device.type != "cuda" and not is_interpreted(kernel):
        raise RuntimeError(
            f"Triton kernels got {device.type} tensors but were compiled for a GPU: set TRITON_INTERPRET=1 "
            "before kernels is first imported to run them on the CPU (slowly), or use the torch backend"
        )


# A Triton helper: Triton reads its parameter annotations (tl.constexpr), and its tensors have no Python type for
# mypy to check, so the decorator and the definition are left untyped (pyproject.toml [tool.mypy]).
@triton.jit  # type: ignore[untyped-decorator]
def cast_rne(x, out_dtype: tl.constexpr, INTERPRETED: tl.constexpr):  # type: ignore[no-untyped-def]
    """fp32 -> `out_dtype`, rounding to nearest even as the GPU (and torch) do. The interpreter truncates
    fp32 -> bf16 (a bias of up to one ulp against the oracle), so there the rounding is done on the bits first."""
    if INTERPRETED and out_dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(out_dtype)
