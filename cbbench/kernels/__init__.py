"""cbbench.kernels: the Triton kernels the engine runs, and their torch oracle.

Every Triton kernel has an oracle of the same name ending in `_ref`: the one definition of what it computes, and
the CPU backend of the engine's layers (which never imports Triton). Shapes and layouts are vLLM's: a paged KV cache
[num_blocks, block_size, num_kv_heads, head_dim], `slot_mapping`, `block_table`, `query_start_loc`, `seq_lens`.

Triton kernels (on a CPU they run under `TRITON_INTERPRET=1`):
    unified_attention     paged causal attention for one step: prefill chunks and decodes in one launch
    reshape_and_cache     write a step's new K and V into their cache slots
    fused_add_rms_norm    residual add + RMSNorm, in place; rms_norm alone
    rotary_embedding      neox-style RoPE on q and k, in place
    silu_and_mul          the SwiGLU gate over a merged gate_up projection
    warmup_attention_kernels, warmup_layer_kernels   compile every variant an engine's steps can pick
Oracles: unified_attention_ref, prefill_attention_ref, reshape_and_cache_ref, fused_add_rms_norm_ref, rms_norm_ref,
rotary_embedding_ref, silu_and_mul_ref.

docs/kernels.md maps each kernel to the layer that calls it and the test that checks it against its oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cbbench._faces import hand_over_bare_name, lazy_exports

if __name__ != "cbbench.kernels":  # reached as a bare `kernels` through the repository's top-level link
    hand_over_bare_name(__name__, __path__[0])

if TYPE_CHECKING:  # the public names: lazy_exports reads them from here
    from cbbench.kernels.reference import fused_add_rms_norm_ref as fused_add_rms_norm_ref
    from cbbench.kernels.reference import prefill_attention_ref as prefill_attention_ref
    from cbbench.kernels.reference import reshape_and_cache_ref as reshape_and_cache_ref
    from cbbench.kernels.reference import rms_norm_ref as rms_norm_ref
    from cbbench.kernels.reference import rotary_embedding_ref as rotary_embedding_ref
    from cbbench.kernels.reference import silu_and_mul_ref as silu_and_mul_ref
    from cbbench.kernels.reference import unified_attention_ref as unified_attention_ref
    from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache as reshape_and_cache
    from cbbench.kernels.triton_rms_norm import fused_add_rms_norm as fused_add_rms_norm
    from cbbench.kernels.triton_rms_norm import rms_norm as rms_norm
    from cbbench.kernels.triton_rope import rotary_embedding as rotary_embedding
    from cbbench.kernels.triton_silu_and_mul import silu_and_mul as silu_and_mul
    from cbbench.kernels.triton_unified_attention import unified_attention as unified_attention
    from cbbench.kernels.warmup import warmup_attention_kernels as warmup_attention_kernels
    from cbbench.kernels.warmup import warmup_layer_kernels as warmup_layer_kernels

__all__, __getattr__, __dir__ = lazy_exports(__name__, __file__)
