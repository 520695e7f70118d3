"""pytest-benchmark suite for the scheduler's cost per step (run: pytest perf/tests/test_bench_scheduler.py --benchmark-only).

Each round is one full step (`schedule()` + `update_from_output()`) with N requests running and decoding. Nothing
here asserts a time (a shared CI box would make that flaky); the target "well under a millisecond at 256" is read
off the printed table, and the step's bookkeeping is checked instead.
"""

import pytest

from cbbench.perf.bench.scheduler_cost import make_decoding_scheduler, step_fn

ROUNDS = 100
WARMUP_ROUNDS = 5


@pytest.mark.parametrize("num_running", [32, 256, 1024])
def test_schedule_step(benchmark, num_running: int) -> None:
    sched = make_decoding_scheduler(num_running, max_steps=ROUNDS + WARMUP_ROUNDS + 1)
    step = step_fn(sched)
    benchmark.extra_info["num_running"] = num_running
    benchmark.pedantic(step, rounds=ROUNDS, iterations=1, warmup_rounds=WARMUP_ROUNDS)
    assert len(sched.running) == num_running  # every request still decoding: nothing preempted, nothing finished
    assert all(r.num_preemptions == 0 for r in sched.running)
    out = sched.schedule()
    assert out.total_num_scheduled_tokens == num_running == out.num_decode_tokens
