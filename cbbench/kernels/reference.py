"""Pure torch: the engine's CPU backend and the single oracle of every Triton kernel in kernels/.

Paged attention and the KV store, in vLLM's layout:
    q, out          [num_tokens, num_heads, head_dim]
    k, v            [num_tokens, num_kv_heads, head_dim]       the new tokens of this step
    k_cache/v_cache [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping    [num_tokens]      block_id * block_size + offset; negative = padding, not written
    query_start_loc [num_seqs + 1]    cumulative query lengths; tokens of seq i are q[qsl[i]:qsl[i+1]]
    seq_lens        [num_seqs]        context length of seq i *including* its new tokens
    block_table     [num_seqs, max_blocks]

Query token j of seq i (query length n_q) sits at absolute position seq_lens[i] - n_q + j and attends
causally to every cached key at positions 0..that position. Math is done in float32 whatever the cache dtype.

The decoder layer's other kernels (RMSNorm with and without the residual add, rotary embedding, SiLU-and-mul) follow
transformers' modeling_llama / modeling_qwen2 op for op: each intermediate that transformers rounds to the model
dtype is rounded here too, so that float32 and bfloat16 results agree with Hugging Face's to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reshape_and_cache_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write each new token's K and V into its cache slot; tokens whose slot is negative are skipped."""
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = k[valid].to(k_cache.dtype)
    v_cache[blocks, offsets] = v[valid].to(v_cache.dtype)


def _gather_kv(cache: torch.Tensor, block_table: torch.Tensor, max_len: int) -> torch.Tensor:
    """[num_seqs, max_blocks] block ids -> contiguous [num_seqs, max_len, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    n_blocks = -(-max_len // block_size)
    ids = block_table[:, :n_blocks].reshape(-1).long()
    # index_select copies whole blocks (memcpy rows); advanced indexing (cache[ids]) copies element by element,
    # several times slower (docs/cpu-profile.md)
    g = cache.index_select(0, ids)  # [S * n_blocks, block_size, kvH, D]
    return g.view(block_table.shape[0], n_blocks * block_size, *cache.shape[2:])[:, :max_len]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q [S, Q, H, D], k/v [S, K, kvH, D] (gathered copies), mask [S, Q, K] (True = attend) -> [S, Q, H, D] float32.

    Plain softmax(q k^T * scale) v through torch's SDPA, which takes the GQA grouping without copying K/V per head.
    """
    # keys no query attends (slots past a short decode's length, gathered because the decodes share one gather)
    # may hold stale or uninitialised values, NaN included; a masked NaN score or 0 weight x NaN value is still NaN
    # (k and v are fresh gathers, so they are zeroed in place)
    unused = ~mask.any(dim=1)[:, :, None, None]  # [S, K, 1, 1]
    k = k.float().masked_fill_(unused, 0.0).transpose(1, 2)  # [S, kvH, K, D]
    v = v.float().masked_fill_(unused, 0.0).transpose(1, 2)
    out = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale, enable_gqa=True
    )  # [S, H, Q, D]
    return out.transpose(1, 2)


def unified_attention_ref(
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
    """Causal paged attention for a batch mixing prefill chunks and decodes; writes and returns `out`.

    Decodes (query length 1) are batched into one gather; longer queries are done one sequence at a time,
    so that a long prefill does not pad every decode to its length. `query_start_loc_cpu` / `seq_lens_cpu`
    (host copies, as the engine's metadata carries them) spare reading the device tensors in every layer.
    Sequences of query length 0 (padding) are skipped.
    """
    qsl = query_start_loc.tolist() if query_start_loc_cpu is None else query_start_loc_cpu
    lens = seq_lens.tolist() if seq_lens_cpu is None else seq_lens_cpu
    q_lens = [qsl[i + 1] - qsl[i] for i in range(len(lens))]
    decode = [i for i, n in enumerate(q_lens) if n == 1]
    if decode:
        idx = torch.tensor(decode, dtype=torch.long, device=q.device)
        kv_len = max(lens[i] for i in decode)
        k = _gather_kv(k_cache, block_table[idx], kv_len)
        v = _gather_kv(v_cache, block_table[idx], kv_len)
        rows = torch.tensor([qsl[i] for i in decode], dtype=torch.long, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] < seq_lens[idx].long()[:, None]  # [S, K]
        o = _attend(q[rows][:, None], k, v, mask[:, None, :], scale)  # [S, 1, H, D]
        out[rows] = o[:, 0].to(out.dtype)
    prefill_attention_ref(q, k_cache, v_cache, out, block_table, qsl, lens, scale)
    return out


def prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    block_table: torch.Tensor,
    qsl: list[int],
    lens: list[int],
    scale: float,
) -> None:
    """The sequences of query length > 1 (prefill chunks), one at a time, into `out` (host lists qsl and lens)."""
    for i in range(len(lens)):
        n = qsl[i + 1] - qsl[i]
        if n <= 1:
            continue
        kv_len = lens[i]
        k = _gather_kv(k_cache, block_table[i : i + 1], kv_len)
        v = _gather_kv(v_cache, block_table[i : i + 1], kv_len)
        q_pos = torch.arange(kv_len - n, kv_len, device=q.device)
        mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None]  # [n, K]
        o = _attend(q[qsl[i] : qsl[i + 1]][None], k, v, mask[None], scale)
        out[qsl[i] : qsl[i + 1]] = o[0].to(out.dtype)


# ---------------------------------------------------------------- the decoder layer's elementwise kernels


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [num_tokens, hidden]: the mean square in float32, the normed value rounded to x's dtype, then
    scaled by `weight` [hidden] (the model dtype) in that dtype (transformers' LlamaRMSNorm)."""
    xf = x.float()
    rstd = xf.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()  # [T, 1] float32
    normed = xf * rstd if x.dtype == torch.float32 else (xf * rstd).to(x.dtype)
    return normed.mul_(weight)  # (weight * normed, bit for bit: one product rounded once)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual), x + residual): the residual add of a decoder layer fused with the next norm, as
    vLLM's fused_add_rms_norm. The sum is rounded to the model dtype before it is normed (as the unfused add)."""
    residual = x + residual
    return rms_norm_ref(residual, weight, eps), residual


def rotary_embedding_ref(positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """Neox-style (rotate-half) RoPE of x [num_tokens, num_heads, head_dim] at `positions` [num_tokens]; returns a
    new tensor. cos_sin_cache [max_position, head_dim] holds cos(position * inv_freq) in its first half and the sines
    in its second, in the model dtype (transformers casts cos and sin to it before use).

    The queries and the keys are rotated alike, so a caller passes them as one tensor of num_heads + num_kv_heads
    heads when they are adjacent (the merged qkv projection's output). Each product is rounded to the model dtype
    before the sum, as transformers' q * cos + rotate_half(q) * sin."""
    half = x.shape[-1] // 2
    cs = cos_sin_cache.index_select(0, positions)[:, None, :]  # [T, 1, D]
    cos, sin = cs[..., :half], cs[..., half:]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate: x [num_tokens, 2 * d] (the merged gate_up projection: gate, then up) -> silu(gate) * up
    [num_tokens, d], each rounded to the model dtype."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]
