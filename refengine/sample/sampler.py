"""Sampler: min_tokens masking, penalties, greedy, temperature, min-p, top-k, top-p and per-request seeds,
vectorised on the device, in vLLM's order (masking and penalties change greedy rows too).

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
    min_p: torch.Tensor | None = None  # [r] float32, 0 = off (None: off for every row)
    # penalties (None: no row of the step has one); the tables are the penalised rows' own, gathered
    penalty_idx: torch.Tensor | None = None  # [p] int64: the rows (of n) that carry a penalty
    prompt_mask: torch.Tensor | None = None  # [p, V] bool: the token occurs in the prompt
    output_counts: torch.Tensor | None = None  # [p, V] int32: occurrences in the output so far
    presence_penalty: torch.Tensor | None = None  # [p] float32
    frequency_penalty: torch.Tensor | None = None  # [p] float32
    repetition_penalty: torch.Tensor | None = None  # [p] float32


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


def _as_int32(x: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> int32 with the same 32 bits (two's complement)."""
    return (x - ((x >> 31) << 32)).to(torch.int32)


def _fmix32_i32(h: torch.Tensor) -> torch.Tensor:
    """_fmix32 on 32-bit patterns held in int32, in place: int32 products wrap mod 2**32 (what _mul32 computes),
    and the arithmetic right shifts are masked to logical ones. Half the bytes of int64 and 11 ops instead of
    18 (no 16-bit split of the products): this runs over the whole [s, V] noise table."""
    h ^= (h >> 16) & 0xFFFF
    h *= _C1_I32
    h ^= (h >> 13) & 0x7FFFF
    h *= _C2_I32
    h ^= (h >> 16) & 0xFFFF
    return h


_C1_I32 = 0x85EBCA6B - (1 << 32)  # _fmix32's constants as int32 values
_C2_I32 = 0xC2B2AE35 - (1 << 32)
_vocab_hash: dict[tuple[int, torch.device], torch.Tensor] = {}  # the per-token part of the hash, [V] int32


def _vocab_part(vocab_size: int, device: torch.device) -> torch.Tensor:
    key = (vocab_size, device)
    if key not in _vocab_hash:
        vocab = torch.arange(vocab_size, dtype=torch.int64, device=device)
        _vocab_hash[key] = _as_int32(_mul32(vocab, 0x9E3779B1))
    return _vocab_hash[key]


def seeded_exponential(seeds: torch.Tensor, output_index: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[s] seeds, [s] output indices -> [s, vocab] Exp(1) noise, a pure function of (seed, k, token id).

    Per row: key = mix(seed, k) (int64, exact); per token: u = fmix(fmix(key ^ token * C) + key), the top 24 bits
    of which give u in (0, 1). `seeded_exponential_reference` is the same in plain int64 arithmetic."""
    seed_lo, seed_hi = seeds & _M32, (seeds >> 32) & _M32
    key = _fmix32(seed_lo ^ _fmix32((seed_hi + 0x9E3779B9) & _M32))
    key = _as_int32(_fmix32(key ^ _fmix32((output_index + 0x7F4A7C15) & _M32)))[:, None]  # [s, 1]
    h = _fmix32_i32(key ^ _vocab_part(vocab_size, seeds.device)[None, :])  # [s, V]
    h = _fmix32_i32(h.add_(key))
    u = ((h >> 8) & 0xFFFFFF).to(torch.float32).add_(0.5).mul_(1.0 / (1 << 24))  # (0, 1), exactly representable
    return u.log_().neg_()


def seeded_exponential_reference(seeds: torch.Tensor, output_index: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The definition of the seeded noise in int64 arithmetic that never overflows (the oracle of the fast path)."""
    seed_lo, seed_hi = seeds & _M32, (seeds >> 32) & _M32
    key = _fmix32(seed_lo ^ _fmix32((seed_hi + 0x9E3779B9) & _M32))
    key = _fmix32(key ^ _fmix32((output_index + 0x7F4A7C15) & _M32))  # [s]
    vocab = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    h = _fmix32(key[:, None] ^ _mul32(vocab, 0x9E3779B1)[None, :])  # [s, V]
    h = _fmix32((h + key[:, None]) & _M32)
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(u)


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """vLLM's apply_penalties on logits [p, V] (in place): repetition on every token seen in prompt or output
    (positive logits divided by it, the rest multiplied), then the OpenAI-style frequency and presence penalties
    on the output's tokens."""
    output_mask = output_counts > 0
    rp = repetition[:, None]
    seen = prompt_mask | output_mask
    logits.copy_(torch.where(seen, torch.where(logits > 0, logits / rp, logits * rp), logits))
    logits -= frequency[:, None] * output_counts
    logits -= presence[:, None] * output_mask
    return logits


def _argmax_block(vocab_size: int) -> int | None:
    """The block length `argmax_rows` splits a row into: the first of these that divides the vocab, or None
    (256 first: a 151936 vocab makes 593 block maxima per row, a short second pass)."""
    for block in (256, 128, 512, 64, 1024, 2048, 4096):
        if vocab_size % block == 0:
            return block
    return None


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for [n, V] rows, the same index (the first maximum; NaN counts as the maximum), in two
    passes on the CPU: the max of every block of the row, then the argmax over the block maxima and within the
    winning block. torch's CPU argmax is a scalar loop; amax is vectorised, so this is several times faster
    (docs/cpu-profile.md). The first block holding the row's maximum holds its first occurrence."""
    n, vocab = x.shape
    block = _argmax_block(vocab)
    if x.device.type != "cpu" or block is None or not x.is_contiguous():
        return x.argmax(dim=-1)
    blocks = x.view(n, vocab // block, block)
    best = blocks.amax(dim=-1).argmax(dim=-1)  # [n] the first block holding each row's maximum
    within = blocks[torch.arange(n, device=x.device), best].argmax(dim=-1)  # [n]
    return best * block + within


def _mask_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the most likely token's (vLLM's min_p)."""
    probs = logits.softmax(dim=-1)
    return logits.masked_fill(probs < probs.amax(dim=-1, keepdim=True) * min_p[:, None], float("-inf"))


def mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """logits [r, V]; top_k [r] (0 = off); top_p [r] (1 = off). Keeps at least one token per row. (Public: `cbbench
    bench-profile` times it as a phase of its own, cbbench/perf/bench/phase_clock.py.)"""
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


def _required(value: torch.Tensor | None, name: str) -> torch.Tensor:
    """A SamplingMetadata field that the fields set for this step imply (the runner fills them together)."""
    if value is None:
        raise ValueError(f"SamplingMetadata.{name} is required by the other fields set for this step")
    return value


def sample(logits: torch.Tensor, md: SamplingMetadata, generator: torch.Generator | None) -> torch.Tensor:
    """logits [n, V] float32 (this step's own, modified in place) -> [n] int64 token ids, on the device."""
    if md.banned_rows is not None:  # no stop condition may fire before min_tokens
        logits[md.banned_rows, md.banned_tokens] = float("-inf")
    if md.penalty_idx is not None:
        logits[md.penalty_idx] = apply_penalties(
            logits[md.penalty_idx],
            _required(md.prompt_mask, "prompt_mask"),
            _required(md.output_counts, "output_counts"),
            _required(md.presence_penalty, "presence_penalty"),
            _required(md.frequency_penalty, "frequency_penalty"),
            _required(md.repetition_penalty, "repetition_penalty"),
        )
    if md.all_greedy:
        return argmax_rows(logits)
    sub = logits if md.random_idx is None else logits[md.random_idx]  # [r, V]
    if md.temperature is None:
        raise ValueError("SamplingMetadata.temperature is required when a row samples at random")
    sub = sub / md.temperature[:, None]
    if md.min_p is not None:
        sub = _mask_min_p(sub, md.min_p)
    if md.top_k is not None or md.top_p is not None:
        sub = mask_top_k_top_p(sub, md.top_k, md.top_p)
    probs = sub.softmax(dim=-1)
    if md.any_unseeded:
        noise = torch.empty_like(probs).exponential_(generator=generator)
    else:
        noise = torch.empty_like(probs)
    if md.seeded_idx is not None:
        seeds, index = _required(md.seeds, "seeds"), _required(md.output_index, "output_index")
        noise[md.seeded_idx] = seeded_exponential(seeds, index, probs.shape[-1])
    drawn = argmax_rows(probs.div_(noise))  # [r]
    if md.random_idx is None:
        return drawn
    out = argmax_rows(logits)  # the greedy rows
    out[md.random_idx] = drawn
    return out
