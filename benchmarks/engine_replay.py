"""Replay a list of requests through an engine on the engine's own clock (virtual on a simulated GPU): each request
is added when the clock reaches its arrival, and an idle engine waits for the next one (the virtual clock jumps).
This is what a driver such as the perf runner does with `engine.clock` in place of time.monotonic()."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from refengine.engine.llm_engine import LLMEngine

from collections.abc import Sequence

from refengine.sampling_params import RequestOutputKind, SamplingParams

# (prompt token ids, output length, arrival in seconds from the start)
ReplayRequest = tuple[Sequence[int], int, float]


def replay_params(max_tokens: int) -> SamplingParams:
    """Greedy, ignore_eos, exactly `max_tokens` tokens, whole outputs only (as the perf runner's replay)."""
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )


def replay(engine: LLMEngine, reqs: Sequence[ReplayRequest]) -> list[dict[str, Any]]:
    """Run every request to its end; returns their metrics (engine-clock times) in request order."""
    clock = engine.clock
    t0 = clock.now()
    order = sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    nxt = 0
    done: dict[str, dict[str, Any]] = {}
    while nxt < len(order) or engine.has_unfinished_requests():
        while nxt < len(order) and t0 + reqs[order[nxt]][2] <= clock.now():
            i = order[nxt]
            engine.add_request(str(i), list(reqs[i][0]), replay_params(reqs[i][1]), arrival_time=t0 + reqs[i][2])
            nxt += 1
        if not engine.has_unfinished_requests():
            clock.sleep_until(t0 + reqs[order[nxt]][2])
            continue
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.metrics
    return [done[str(i)] for i in range(len(reqs))]
