"""SiLU-and-mul, SwiGLU's gate over the merged gate_up projection (vLLM's layers/activation.py `SiluAndMul`).

x [T, 2 * intermediate] (gate | up) -> silu(gate) * up [T, intermediate]. The Triton kernel
(cbbench.kernels.triton_silu_and_mul) runs with the triton attention backend; the torch path is the oracle
(cbbench.kernels.reference), which does not import Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from cbbench.kernels.reference import silu_and_mul_ref


class SiluAndMul(nn.Module):
    def __init__(self, *, use_triton: bool = False) -> None:
        super().__init__()
        self._fn: Callable[[torch.Tensor], torch.Tensor] = silu_and_mul_ref
        if use_triton:
            from cbbench.kernels.triton_silu_and_mul import silu_and_mul

            self._fn = silu_and_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x)
