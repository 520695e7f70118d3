"""What one request's stop list costs everyone else: the median LLMEngine.step() CPU time of a batch of greedy
decoding requests, alone and beside one request that carries a long `stop` or `stop_token_ids` list.

The engine's host work is serial, so a stop check that grows with the stop list slows every request's step. Run:
    python -m benchmarks.stop_lists [--stops N] [--stop-len L] [--stop-ids N] [--steps S]
It prints the median step time of each case and its factor over the baseline. The forward is bench-step's stub
(perf/bench/step.py), so that the step is the host work the stop lists add to; the time is this thread's CPU time
(the engine steps in it), which other load on the machine disturbs less than the wall clock; still, compare only
numbers from one run (the cases are interleaved). The stop strings are private-use characters, which the stub's
tokens never decode to, so the stop-list request runs to the end and pays for the search every step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

NUM_INNOCENT = 8
PROMPT_LEN = 16
STOP_ID_BASE = 150_000  # stop ids above every id the stub writes, inside the model's vocabulary


def _stops(count: int, length: int) -> list[str]:
    """`count` distinct stop strings of `length` characters, or of lengths 1..count when length is 0."""
    return [chr(0xE000 + i) * (length or i + 1) for i in range(count)]


def median_step_ms(steps: int, **hostile: Any) -> float:
    """Median step time (ms) of NUM_INNOCENT greedy requests, plus one carrying `hostile` SamplingParams fields."""
    from cbbench.perf.bench.step import StubModel
    from refengine import LLMEngine, SamplingParams
    from refengine.models.presets import load_model_config

    stub = StubModel(load_model_config("tiny-qwen2").hidden_size)
    engine = LLMEngine(
        "tiny-qwen2", num_gpu_blocks=256, block_size=16, max_model_len=512, model_impl=stub, sampler=stub.sample
    )
    for i in range(NUM_INNOCENT):
        prompt = [1000 + 7 * i + j for j in range(PROMPT_LEN)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True))
    if hostile:
        engine.add_request(
            "stops",
            [900 + j for j in range(PROMPT_LEN)],
            SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True, **hostile),
        )
    engine.step()  # the prefills
    times: list[float] = []
    for _ in range(steps):
        t = time.thread_time()
        engine.step()
        times.append(time.thread_time() - t)
    left = engine.scheduler.get_num_unfinished_requests()
    assert left == NUM_INNOCENT + bool(hostile), (left, hostile.keys())
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=128, help="stop strings of the stop-list request")
    parser.add_argument("--stop-len", type=int, default=0, help="their length (0: lengths 1..--stops, distinct)")
    parser.add_argument("--stop-ids", type=int, default=1024, help="stop_token_ids of the stop-id request")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="cases are interleaved, median of the rounds")
    args = parser.parse_args()
    cases: dict[str, dict[str, Any]] = {
        "baseline": {},
        f"stop: {args.stops} strings": {"stop": _stops(args.stops, args.stop_len)},
        f"stop_token_ids: {args.stop_ids}": {"stop_token_ids": [STOP_ID_BASE + i for i in range(args.stop_ids)]},
    }
    got: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, hostile in cases.items():
            got[name].append(median_step_ms(args.steps, **hostile))
    base = statistics.median(got["baseline"])
    for name, values in got.items():
        ms = statistics.median(values)
        print(f"{name:28s} {ms:8.3f} ms/step   x{ms / base:5.2f}")


if __name__ == "__main__":
    main()
