"""The scheduler's own cost (far below a forward step, < 1 ms): one full step = `schedule()` +
`update_from_output()` with N requests already running and decoding, model-free.

Shared by `perf/tests/test_bench_scheduler.py` (pytest-benchmark) and `cbbench bench-scheduler` (plain timing).
The KV pool is sized so no request is ever preempted during the timed steps, and prefix caching stays on (the
default), so a step also pays for hashing each block that fills.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from refengine.scheduler.scheduler import Scheduler

PROMPT_LEN = 32
BLOCK_SIZE = 16
_TOKEN = 7  # the token every request "samples"; never EOS (and ignore_eos is set anyway)
_EOS = 0


def make_decoding_scheduler(num_running: int, max_steps: int = 2000) -> Scheduler:
    """A Scheduler with `num_running` requests past their prefill, each with room for `max_steps` more tokens."""
    from refengine.request import Request  # (brings in numpy)
    from refengine.sampling_params import SamplingParams  # (brings in numpy)
    from refengine.scheduler.scheduler import Scheduler  # (brings in numpy)

    blocks_per_req = -(-(PROMPT_LEN + max_steps + 2) // BLOCK_SIZE)
    sched = Scheduler(
        eos_token_id=_EOS,
        max_num_batched_tokens=max(8192, num_running * PROMPT_LEN),
        max_num_seqs=num_running,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=num_running * blocks_per_req,
    )
    params = SamplingParams(max_tokens=max_steps + 2, ignore_eos=True, temperature=0.0)
    for i in range(num_running):
        # distinct prompts, so the prefix cache shares nothing and every request owns its blocks
        sched.add_request(
            Request(
                f"r{i}",
                [1000 + i] + [100 + (i + j) % 5000 for j in range(PROMPT_LEN - 1)],
                params,
                arrival_time=float(i),
            )
        )
    out = sched.schedule()  # the whole batch prefills in one step
    sched.update_from_output(out, {rid: [_TOKEN] for rid in out.num_scheduled_tokens})
    assert len(sched.running) == num_running and not sched.waiting
    return sched


def step_fn(sched: Scheduler) -> Callable[[], None]:
    sampled = {r.request_id: [_TOKEN] for r in sched.running}  # what the model runner hands back: one token each

    def step() -> None:
        out = sched.schedule()
        sched.update_from_output(out, sampled)

    return step


def bench_step_us(num_running: int, iters: int = 200, warmup: int = 5) -> dict[str, float]:
    """Microseconds per full step (median, p90, min) over `iters` timed steps."""
    sched = make_decoding_scheduler(num_running, max_steps=iters + warmup)
    step = step_fn(sched)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return {
        "num_running": num_running,
        "median_us": statistics.median(times),
        "p90_us": times[int(0.9 * (len(times) - 1))],
        "min_us": times[0],
    }
