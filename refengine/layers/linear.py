"""The decoder's linear layers: `Linear` (torch's, without its initialiser) and `MergedLinear`, several projections
of one input stored as one weight so that a layer runs one GEMM where a checkpoint has several (vLLM's
QKVParallelLinear and MergedColumnParallelLinear, without tensor parallelism).

A checkpoint keeps the projections apart (`q_proj`, `k_proj`, `v_proj`; `gate_proj`, `up_proj`): a merged layer
names its shards after them, in output order, and `shard_views` gives each shard's rows of a merged parameter, so
a loader writes a checkpoint tensor straight into its rows and the Hugging Face twin reads them back
(refengine/models/decoder.py `CausalLM.checkpoint_weights`).
"""

from __future__ import annotations

import torch
from torch import nn


class Linear(nn.Linear):
    """nn.Linear without torch's initialiser: every weight is written by the loader (a seeded draw or a checkpoint).
    Models are built on the `meta` device, where the initialiser's first call runs torch's Python meta kernels,
    which import torch._dynamo and, through it, Triton: seconds of start-up for values that are overwritten, and
    the torch backend would no longer run without Triton."""

    def reset_parameters(self) -> None:
        pass


class MergedLinear(Linear):
    """Projections of one input concatenated along the output: y [T, sum(sizes)] = x @ [W_a; W_b; ...]^T (+ bias),
    shard a in columns [0, size_a) of y, b next, and so on.

        weight  [sum(output_sizes), input_size]   rows of shard i at offsets[i] : offsets[i] + output_sizes[i]
        bias    [sum(output_sizes)]               (when bias=True) the same split
    """

    def __init__(self, input_size: int, shards: dict[str, int], *, bias: bool) -> None:
        super().__init__(input_size, sum(shards.values()), bias=bias)
        self.shard_sizes = dict(shards)  # checkpoint module name -> output rows, in output order

    def shard_views(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        """The rows of `param` (this layer's weight or bias) that each shard owns, as views (writable)."""
        views, offset = {}, 0
        for name, size in self.shard_sizes.items():
            views[name] = param.narrow(0, offset, size)
            offset += size
        return views

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, shards={self.shard_sizes}"
