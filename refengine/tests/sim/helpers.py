"""Shared pieces of the simulated-GPU tests: workloads of (prompt, output length, arrival) requests and their
sampling params (benchmarks/engine_replay.py drives them through an engine on its own clock)."""

from __future__ import annotations

from refengine import SamplingParams


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def workload(
    n: int, seed: int = 0, prompt_len: tuple[int, int] = (8, 200), out_len: tuple[int, int] = (1, 60), gap: float = 0.0
) -> list[tuple[list[int], int, float]]:
    """n distinct token-id prompts with varied lengths; arrivals `gap` simulated seconds apart (0: all at once)."""
    import random

    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        p = [1000 + (7 * i + j) % 5000 for j in range(rng.randint(*prompt_len))]
        p[0] = 100 + i  # distinct first block: no prefix-cache sharing between requests
        reqs.append((p, rng.randint(*out_len), i * gap))
    return reqs
