"""Sampler: greedy, temperature, top-k, top-p, min_tokens masking, and per-request seeds.

A seeded request's k-th output token is drawn with noise from a generator seeded by (seed, k) alone, so its tokens
do not depend on what else is in the batch, nor on whether it was preempted and recomputed.
"""
from __future__ import annotations

import torch

from refengine.request import Request

_SEED_STRIDE = 1_000_003  # mixes the output index into the per-request seed


def _mask_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [n, V]; top_k [n] (0 = off); top_p [n] (1 = off). Keeps at least one token per row."""
    sorted_logits, idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    drop = ranks >= k[:, None]
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    cum = probs.cumsum(dim=-1)
    drop |= (cum - probs) >= top_p[:, None]  # tokens entirely beyond the nucleus
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, idx, sorted_logits)


def sample(logits: torch.Tensor, requests: list[Request], generator: torch.Generator) -> list[int]:
    """logits [n, V] float32, one row per request that samples this step -> one token id each."""
    for i, req in enumerate(requests):
        sp = req.sampling_params
        if req.num_output_tokens < sp.min_tokens:  # no stop condition may fire before min_tokens
            banned = list(sp.stop_token_ids) + ([] if sp.ignore_eos else list(req.eos_token_ids))
            if banned:
                logits[i, banned] = float("-inf")  # (the logits are this step's own, free to change)
    out = logits.argmax(dim=-1)
    rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
    if rows:
        sub = logits[rows]
        temp = torch.tensor([requests[i].sampling_params.temperature for i in rows], device=logits.device)
        top_k = torch.tensor([requests[i].sampling_params.top_k for i in rows], device=logits.device)
        top_p = torch.tensor([requests[i].sampling_params.top_p for i in rows], device=logits.device)
        probs = _mask_top_k_top_p(sub / temp[:, None], top_k, top_p).softmax(dim=-1)
        noise = torch.empty_like(probs)
        for j, i in enumerate(rows):
            req = requests[i]
            if req.sampling_params.seed is not None:
                g = torch.Generator(device=probs.device)
                g.manual_seed(req.sampling_params.seed * _SEED_STRIDE + req.num_output_tokens)
            else:
                g = generator
            noise[j].exponential_(generator=g)
        # argmax(p / E) with E ~ Exp(1) draws from p (the exponential-race form of Gumbel-max)
        out[rows] = (probs / noise).argmax(dim=-1)
    return out.tolist()
