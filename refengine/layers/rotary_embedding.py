"""Rotary position embedding, neox style (rotate-half, as Qwen2 and Llama use), over a cos/sin cache built once
(vLLM's layers/rotary_embedding.py `RotaryEmbedding`).

The cache [max_position, head_dim] holds cos(p * inv_freq) in the first half of row p and the sines in the second,
from refengine/models/model_config.py's `rope_inv_freq` (Llama-3.1's scaling included), computed in float32 and
rounded to the model dtype as transformers does. It is a plain attribute made at the first forward on a device and
dtype, not a buffer: `model.to(bfloat16)` must not round the frequencies, and the model is built on `meta`.

`forward(positions, x)` rotates x [T, heads, head_dim]; a decoder passes its queries and keys as one x (the first
num_heads + num_kv_heads heads of the merged qkv output). The Triton kernel (cbbench.kernels.triton_rope)
rotates in place and runs with the triton attention backend; the torch path is the oracle
(cbbench.kernels.reference), which returns a new tensor and does not import Triton.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from cbbench.kernels.reference import rotary_embedding_ref


class RotaryEmbedding(nn.Module):
    def __init__(self, inv_freq: torch.Tensor, max_position: int, *, use_triton: bool = False) -> None:
        """inv_freq [head_dim // 2] float32 on the CPU; positions must stay below `max_position`."""
        super().__init__()
        self.head_dim = 2 * inv_freq.shape[0]
        self.max_position = max_position
        self._inv_freq = inv_freq
        self._caches: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = rotary_embedding_ref
        if use_triton:
            from cbbench.kernels.triton_rope import rotary_embedding

            self._fn = rotary_embedding

    def cos_sin_cache(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """[max_position, head_dim]: cos | sin of every position, in `dtype` on `device` (made once)."""
        cache = self._caches.get((device, dtype))
        if cache is None:
            inv_freq = self._inv_freq.to(device)
            freqs = torch.arange(self.max_position, device=device, dtype=torch.float32)[:, None] * inv_freq
            cache = self._caches[(device, dtype)] = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
        return cache

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """positions [T] int, x [T, heads, head_dim] -> x rotated (in place with the Triton kernel)."""
        return self._fn(positions, x, self.cos_sin_cache(x.device, x.dtype))

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_position={self.max_position}"
