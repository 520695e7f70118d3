"""RMSNorm, with the residual add of the block before it fused in (vLLM's layers/layernorm.py).

`RMSNorm(x)` normalises; `RMSNorm(x, residual)` returns (RMSNorm(x + residual), x + residual), so that a decoder
layer carries its residual stream beside the hidden states and adds it in the next norm, one launch where the
unfused code had an add and a norm. The Triton kernels (cbbench.kernels.triton_rms_norm, in place) run with the triton
attention backend; the torch path is the oracle itself (cbbench.kernels.reference), which does not import Triton.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import overload

import torch
from torch import nn

from cbbench.kernels.reference import fused_add_rms_norm_ref, rms_norm_ref


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, use_triton: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self._norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] = rms_norm_ref
        self._add_norm: Callable[
            [torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]
        ] = fused_add_rms_norm_ref
        if use_triton:
            from cbbench.kernels.triton_rms_norm import fused_add_rms_norm, rms_norm

            self._norm, self._add_norm = rms_norm, fused_add_rms_norm

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> normed [T, hidden]; with `residual` [T, hidden] -> (normed, new residual). With the
        Triton kernel both inputs are overwritten (they are the outputs): callers use only what is returned."""
        if residual is None:
            return self._norm(x, self.weight, self.eps)
        return self._add_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
