"""Sampler: greedy, temperature, top-k, top-p, min_tokens masking and per-request seeds, vectorised on the device.

Nothing here reads a device value on the host: the model runner decides from its host copies of the parameters
which paths a step needs (all greedy? any top-k? any seed?) and hands over device index tensors, and the sampler
returns the token ids as a device tensor, which the runner copies to the host once per step.

Sampling is Gumbel-max in its exponential-race form: argmax(p / E) with E ~ Exp(1) draws from p. A seeded
request's noise for its k-th output token is a counter-based hash of (seed, k, token id) alone, so its tokens
depend neither on the batch around it nor on whether it was preempted and recomputed; unseeded requests draw
their noise from the engine's generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


@dataclass
class SamplingMetadata:
    """Device tensors for the n rows that sample this step (vLLM's name); None means "not needed this step"."""

    all_greedy: bool
    random_idx: torch.Tensor | None = None  # [r] int64: the rows that sample at random (None: every row)
    temperature: torch.Tensor | None = None  # [r] float32
    top_k: torch.Tensor | None = None  # [r] int64, 0 = off (None: off for every row)
    top_p: torch.Tensor | None = None  # [r] float32, 1 = off (None: off for every row)
    seeded_idx: torch.Tensor | None = None  # [s] int64: indices into the random rows that carry a seed
    seeds: torch.Tensor | None = None  # [s] int64
    output_index: torch.Tensor | None = None  # [s] int64: k, the index of the output token being drawn
    any_unseeded: bool = True
    banned_rows: torch.Tensor | None = None  # [m] int64 } (row, token id) pairs masked to -inf: EOS and stop
    banned_tokens: torch.Tensor | None = None  # [m] int64 } ids of rows still short of min_tokens


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x < 2**32 in int64, split in 16-bit halves so that no product overflows int64."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser: a bijection that mixes every input bit into every output bit."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def seeded_exponential(seeds: torch.Tensor, output_index: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[s] seeds, [s] output indices -> [s, vocab] Exp(1) noise, a pure function of (seed, k, token id)."""
    seed_lo, seed_hi = seeds & _M32, (seeds >> 32) & _M32
    key = _fmix32(seed_lo ^ _fmix32((seed_hi + 0x9E3779B9) & _M32))
    key = _fmix32(key ^ _fmix32((output_index + 0x7F4A7C15) & _M32))  # [s]
    vocab = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _fmix32(key[:, None] ^ _mul32(vocab, 0x9E3779B1)[None, :])  # [s, V]
    h = _fmix32((h + key[:, None]) & _M32)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # (0, 1), exactly representable
    return -torch.log(u)


def _mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """logits [r, V]; top_k [r] (0 = off); top_p [r] (1 = off). Keeps at least one token per row."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        drop = ranks >= k[:, None]
    if top_p is not None:
        probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        drop |= (cum - probs) >= top_p[:, None]  # tokens entirely beyond the nucleus
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def sample(logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
    """logits [n, V] float32 (this step's own, modified in place) -> [n] int64 token ids, on the device."""
    if md.banned_rows is not None:  # no stop condition may fire before min_tokens
        logits[md.banned_rows, md.banned_tokens] = float("-inf")
    if md.all_greedy:
        return logits.argmax(dim=-1)
    sub = logits if md.random_idx is None else logits[md.random_idx]  # [r, V]
    sub = sub / md.temperature[:, None]
    if md.top_k is not None or md.top_p is not None:
        sub = _mask_top_k_top_p(sub, md.top_k, md.top_p)
    probs = sub.softmax(dim=-1)
    if md.any_unseeded:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    else:
        noise = torch.empty_like(probs)
    if md.seeded_idx is not None:
        noise[md.seeded_idx] = seeded_exponential(md.seeds, md.output_index, probs.shape[-1])
    drawn = (probs / noise).argmax(dim=-1)  # [r]
    if md.random_idx is None:
        return drawn
    out = logits.argmax(dim=-1)  # the greedy rows
    out[md.random_idx] = drawn
    return out
