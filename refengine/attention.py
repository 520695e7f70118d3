"""Attention metadata of one step and the attention backends that consume it.

The metadata is built by the model runner once per step and passed down explicitly (no global forward context).
Backends share one signature, so that `torch` (the oracle in cbbench.kernels.reference, the CPU path) and `triton`
(cbbench.kernels, the GPU path; also runs under TRITON_INTERPRET=1) are interchangeable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from cbbench.kernels.reference import reshape_and_cache_ref, unified_attention_ref

ATTENTION_BACKENDS = ("torch", "triton")


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the paged cache and what each sequence attends to (vLLM's names)."""

    slot_mapping: torch.Tensor  # [num_tokens] int64: block_id * block_size + offset (negative = padding)
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32: context length including this step's tokens
    block_table: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int
    max_seq_len: int
    # host copies (lists) of query_start_loc and seq_lens, so that the torch oracle plans its gathers without
    # reading device tensors in every layer; None (e.g. hand-built metadata): the oracle reads the tensors
    query_start_loc_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None


@dataclass(frozen=True)
class AttentionBackend:
    name: str
    reshape_and_cache: Callable[..., None]  # (k, v, k_cache, v_cache, slot_mapping)
    unified_attention: Callable[..., torch.Tensor]  # (q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table, scale)
    takes_host_lens: bool = False  # unified_attention also takes query_start_loc_cpu= / seq_lens_cpu=

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """unified_attention over one step's metadata (the host copies go to the backends that use them)."""
        if self.takes_host_lens:
            return self.unified_attention(q, k_cache, v_cache, out, meta.query_start_loc, meta.seq_lens,
                                          meta.block_table, scale, query_start_loc_cpu=meta.query_start_loc_cpu,
                                          seq_lens_cpu=meta.seq_lens_cpu)
        return self.unified_attention(q, k_cache, v_cache, out, meta.query_start_loc, meta.seq_lens,
                                      meta.block_table, scale)


def default_backend_name(device: torch.device) -> str:
    """`triton` on CUDA, `torch` elsewhere."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return AttentionBackend("torch", reshape_and_cache_ref, unified_attention_ref, takes_host_lens=True)
    if name == "triton":
        from cbbench.kernels import reshape_and_cache, unified_attention

        return AttentionBackend("triton", reshape_and_cache, unified_attention)
    raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")

