"""Shared drivers for the simulated-GPU tests: a replay of (prompt, output length, arrival) requests through an
engine, stepping it as the perf runner does but on the engine's own clock (virtual on a simulated GPU)."""
from __future__ import annotations

from refengine import LLMEngine, SamplingParams


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def workload(n: int, seed: int = 0, prompt_len: tuple[int, int] = (8, 200), out_len: tuple[int, int] = (1, 60),
             gap: float = 0.0) -> list[tuple[list[int], int, float]]:
    """n distinct token-id prompts with varied lengths; arrivals `gap` simulated seconds apart (0: all at once)."""
    import random

    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        p = [1000 + (7 * i + j) % 5000 for j in range(rng.randint(*prompt_len))]
        p[0] = 100 + i  # distinct first block: no prefix-cache sharing between requests
        reqs.append((p, rng.randint(*out_len), i * gap))
    return reqs


def replay(engine: LLMEngine, reqs: list[tuple[list[int], int, float]]) -> list[dict]:
    """Add each request when the clock reaches its arrival (the clock waits when the engine is idle); step until
    all are done. Returns the per-request metrics in request order."""
    clock = engine.clock
    t0 = clock.now()
    order = sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    nxt, done = 0, {}
    while nxt < len(order) or engine.has_unfinished_requests():
        while nxt < len(order) and t0 + reqs[order[nxt]][2] <= clock.now():
            i = order[nxt]
            engine.add_request(str(i), reqs[i][0], params(reqs[i][1]), arrival_time=t0 + reqs[i][2])
            nxt += 1
        if not engine.has_unfinished_requests():
            clock.sleep_until(t0 + reqs[order[nxt]][2])
            continue
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.metrics
    return [done[str(i)] for i in range(len(reqs))]
