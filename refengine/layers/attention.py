"""Attention metadata of one step and the attention backends that consume it.

The metadata is built by the model runner once per step and passed down explicitly (no global forward context).
Backends share one signature, so that `torch` (the CPU path) and `triton` (kernels, the GPU path; also runs
under TRITON_INTERPRET=1) are interchangeable. The `torch` backend is the oracle of cbbench.kernels.reference for
prefill chunks and its own chunked decode attention (`decode_attention_cpu`) for the decodes; the oracle stays the
single source of truth that both backends are tested against.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cbbench.kernels.reference import prefill_attention_ref, reshape_and_cache_ref
from refengine.config import ATTENTION_BACKENDS

# Keys per chunk of the CPU decode attention: the chunk's gathered K and V (at 64 decodes, 2 KV heads x 64 dims:
# 64 x 64 x 512 B = 2 MB each) stay in cache between the gather and the attention that reads them, so the KV
# cache is read from memory once. Tuned on the CPU against 16 and 64 decodes of ShareGPT-like lengths (to 768):
# smaller chunks gain nothing, larger ones lose at 64 decodes (docs/cpu-profile.md).
DECODE_CHUNK_TOKENS = 64

# (output [B, H, Lq, D], logsumexp [B, H, Lq]) = attention of q [B, H, Lq, D] over k, v [B, kvH, Lk, D]; torch's
# fused CPU kernel, the one F.scaled_dot_product_attention runs, called directly for its log-sum-exp
_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


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
    unified_attention: Callable[
        ..., torch.Tensor
    ]  # (q, k_cache, v_cache, out, query_start_loc, seq_lens, block_table, scale)
    takes_host_lens: bool = False  # unified_attention also takes query_start_loc_cpu= / seq_lens_cpu=

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        out: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """unified_attention over one step's metadata (the host copies go to the backends that use them)."""
        if self.takes_host_lens:
            return self.unified_attention(
                q,
                k_cache,
                v_cache,
                out,
                meta.query_start_loc,
                meta.seq_lens,
                meta.block_table,
                scale,
                query_start_loc_cpu=meta.query_start_loc_cpu,
                seq_lens_cpu=meta.seq_lens_cpu,
            )
        return self.unified_attention(
            q, k_cache, v_cache, out, meta.query_start_loc, meta.seq_lens, meta.block_table, scale
        )


def decode_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_table: torch.Tensor,
    seqs: list[int],
    rows: list[int],
    lens: list[int],
    scale: float,
) -> None:
    """Decode attention (one query token per sequence) over the paged cache, written into out[rows].

    Same function as the oracle's decode path, computed so that the KV cache is read once: the sequences are
    sorted by length and the keys are taken a chunk of block-table columns at a time, only for the sequences that
    reach that chunk (no padding to the longest); the chunks' partial outputs are merged by their log-sum-exp.
    Slots past a sequence's length are zeroed in K and V and masked out of the scores, so stale values (NaN
    included) never reach the output.
    """
    bs, kvh, dim = k_cache.shape[1:]
    dev, heads = q.device, q.shape[1]
    order = sorted(range(len(seqs)), key=lambda j: -lens[j])
    s_lens = [lens[j] for j in order]  # descending
    neg_lens = [-n for n in s_lens]
    n = len(order)
    table = block_table[torch.tensor([seqs[j] for j in order], device=dev)]  # [S, max_blocks]
    row_t = torch.tensor([rows[j] for j in order], device=dev)
    qh = q[row_t].float()[:, :, None, :]  # [S, H, 1, D]
    acc = torch.zeros(n, heads, 1, dim, device=dev)  # the output over the keys so far
    lse = torch.full((n, heads, 1), float("-inf"), device=dev)  # log-sum-exp of their scores
    lens_t = torch.tensor(s_lens, device=dev)
    positions = torch.arange(-(-s_lens[0] // bs) * bs, device=dev)  # key positions, sliced per chunk
    step = max(1, DECODE_CHUNK_TOKENS // bs)
    for b0 in range(0, -(-s_lens[0] // bs), step):
        start = b0 * bs
        a = bisect.bisect_left(neg_lens, -start)  # the sequences longer than `start` (a prefix: sorted)
        nb = min(step, -(-(s_lens[0] - start) // bs))
        width = nb * bs
        ids = table[:a, b0 : b0 + nb].reshape(-1).long()
        k = k_cache.index_select(0, ids).view(a, width, kvh, dim).float()  # [a, C, kvH, D]
        v = v_cache.index_select(0, ids).view(a, width, kvh, dim).float()
        mask = None
        full = bisect.bisect_right(neg_lens, -(start + width))  # sequences [full, a) end inside this chunk
        if full < a:  # (only their rows are zeroed: a pass over K and V)
            unused = positions[start : start + width][None, :] >= lens_t[full:a, None]  # [a - full, C]
            k[full:a].masked_fill_(unused[:, :, None, None], 0.0)  # (a NaN score stays NaN under the mask)
            v[full:a].masked_fill_(unused[:, :, None, None], 0.0)
            mask = torch.zeros(a, 1, 1, width, device=dev)
            mask[full:a, 0, 0].masked_fill_(unused, float("-inf"))
        # torch's fused CPU attention (GQA on the strided [a, kvH, C, D] views, no copies) also returns the
        # log-sum-exp that merges chunks, so one call per chunk does what two per-head bmm pairs and a hand-written
        # online softmax did, in less time (docs/cpu-profile.md)
        out_c, lse_c = _flash_cpu(qh[:a], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale)
        merged = torch.logaddexp(lse[:a], lse_c)
        acc[:a].mul_((lse[:a] - merged).exp_()[..., None]).add_(out_c.mul_((lse_c - merged).exp_()[..., None]))
        lse[:a] = merged
    out[row_t] = acc.view(n, heads, dim).to(out.dtype)


def unified_attention_cpu(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    *,
    query_start_loc_cpu: list[int] | None = None,
    seq_lens_cpu: list[int] | None = None,
) -> torch.Tensor:
    """The `torch` backend: decodes through decode_attention_cpu, longer queries through the oracle."""
    qsl = query_start_loc.tolist() if query_start_loc_cpu is None else query_start_loc_cpu
    lens = seq_lens.tolist() if seq_lens_cpu is None else seq_lens_cpu
    decode = [i for i in range(len(lens)) if qsl[i + 1] - qsl[i] == 1]
    if decode:
        decode_attention_cpu(
            q, k_cache, v_cache, out, block_table, decode, [qsl[i] for i in decode], [lens[i] for i in decode], scale
        )
    prefill_attention_ref(q, k_cache, v_cache, out, block_table, qsl, lens, scale)
    return out


def default_backend_name(device: torch.device) -> str:
    """`triton` on CUDA, `torch` elsewhere."""
    return "triton" if torch.device(device).type == "cuda" else "torch"


def get_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return AttentionBackend("torch", reshape_and_cache_ref, unified_attention_cpu, takes_host_lens=True)
    if name == "triton":
        from cbbench.kernels.triton_reshape_and_cache import reshape_and_cache
        from cbbench.kernels.triton_unified_attention import unified_attention

        return AttentionBackend("triton", reshape_and_cache, unified_attention)
    raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
