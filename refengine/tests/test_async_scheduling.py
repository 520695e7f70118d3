"""Async scheduling end to end on the real tiny model: `async_scheduling=True` (vLLM's AsyncScheduler and its
engine core's batch queue) gives every request exactly the tokens of sync mode, greedy and seeded, whatever else
happens while a step is in flight: preemption (recompute, swap), chunked prefill, prefix caching, priorities,
aborts, stop strings and stop ids, max_tokens; and it does overlap the scheduling of step N+1 with step N's forward.
The model-free side (placeholders, stale outputs of preempted requests, in-flight finishes) is checked by the state
machine (test_scheduler_stateful.py, which draws async_scheduling) and against vLLM (test_vllm_differential.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLM, LLMEngine, SamplingParams

LENS = (1, 5, 16, 17, 40, 90, 33, 8)
MAX_TOKENS = (14, 18, 12, 15, 14, 16, 1, 2)  # 1 and 2: a request whose first in-flight token is already its last
BLOCK = 4
TIGHT_BLOCKS = 30  # fits each request alone (the longest needs 27), not all of them (~100): the engine must preempt
TIGHT_SEEDED_BLOCKS = 28  # the first six requests need ~66 blocks together, the longest 27
SHARED = make_prompts((24,), seed=3)[0]  # a prefix several prompts share, so that prefix caching hits


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    ps = make_prompts(LENS, seed=7)
    return ps + [SHARED + p[:6] for p in ps[:3]]


def _params(n: int) -> list[SamplingParams]:
    return [greedy(m) for m in (MAX_TOKENS + MAX_TOKENS[:3])[:n]]


def _run(prompts, params, **knobs) -> tuple[list[tuple[list[int], str]], LLM]:
    llm = LLM(TEST_MODEL, block_size=BLOCK, **knobs)
    outs = llm.generate(prompts, params)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs], llm


KNOBS = {
    "recompute": dict(num_gpu_blocks=TIGHT_BLOCKS, max_num_batched_tokens=64),
    "swap": dict(num_gpu_blocks=TIGHT_BLOCKS, num_cpu_blocks=64, preemption_mode="swap", max_num_batched_tokens=64),
    "chunked": dict(num_gpu_blocks=512, max_num_batched_tokens=16, long_prefill_token_threshold=8, max_num_seqs=4),
    "priority-nocache": dict(
        num_gpu_blocks=TIGHT_BLOCKS, max_num_batched_tokens=64, policy="priority", enable_prefix_caching=False
    ),
}


@pytest.mark.parametrize("name", list(KNOBS))
def test_greedy_tokens_equal_sync(prompts, name):
    knobs = KNOBS[name]
    params = _params(len(prompts))
    sync, _ = _run(prompts, params, **knobs)
    got, llm = _run(prompts, params, async_scheduling=True, **knobs)
    assert got == sync
    for (tokens, reason), sp in zip(got, params):  # max_tokens exact: the in-flight token never overshoots
        assert reason == "length" and len(tokens) == sp.max_tokens
    sched = llm.llm_engine.scheduler
    if name != "chunked":
        assert sched.num_preemptions > 0, "the KV pool was meant to force preemptions"
    assert sched.num_free_blocks == sched.config.num_gpu_blocks  # nothing leaked by outputs arriving late
    assert not llm.llm_engine.has_unfinished_requests()


def test_seeded_sampling_equal_sync(prompts):
    params = [
        SamplingParams(max_tokens=m, temperature=0.9, seed=100 + i)  # (top-k/top-p: a slow sort, same path)
        for i, m in enumerate(MAX_TOKENS[:6])
    ]
    knobs = dict(KNOBS["recompute"], num_gpu_blocks=TIGHT_SEEDED_BLOCKS)
    sync, _ = _run(prompts[:6], params, **knobs)
    got, llm = _run(prompts[:6], params, async_scheduling=True, **knobs)
    assert got == sync
    assert llm.llm_engine.scheduler.num_preemptions > 0
    greedy_tokens = LLM(TEST_MODEL, num_gpu_blocks=512).generate([prompts[4]], greedy(MAX_TOKENS[4]))[0]
    assert got[4][0] != greedy_tokens.outputs[0].token_ids  # it really sampled


def test_stop_strings_and_stop_ids_equal_sync():
    base = LLM(TEST_MODEL, num_gpu_blocks=512).generate(["Once upon a time", "Hello there"], greedy(24))
    text, ids = base[0].outputs[0].text, base[1].outputs[0].token_ids
    assert len(text) > 12 and len(ids) > 4
    params = [
        greedy(24, stop=[text[6:10]]),
        greedy(24, stop_token_ids=[ids[3]]),
        greedy(24, stop_token_ids=[ids[0]], min_tokens=5),
    ]
    prompts = ["Once upon a time", "Hello there", "Hello there"]
    results = {}
    for mode in (False, True):
        outs = LLM(TEST_MODEL, num_gpu_blocks=512, async_scheduling=mode).generate(prompts, params)
        results[mode] = [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outs]
    assert results[True] == results[False]
    assert [r for _, _, r in results[True][:2]] == ["stop", "stop"]
    (cut, _, _), (stopped, _, _), (held, _, _) = results[True]
    assert len(cut) < 24 and stopped == ids[: ids.index(ids[3]) + 1] and len(held) >= 5


def _drain(engine: LLMEngine, got: dict[str, list]) -> None:
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)


def test_abort_while_its_step_is_in_flight():
    prompts = make_prompts((30, 10, 12), seed=1)
    ref = {}
    ref_engine = LLMEngine(TEST_MODEL, num_gpu_blocks=128, block_size=4)
    for rid, p in zip("abc", prompts):
        ref_engine.add_request(rid, p, greedy(12))
    _drain(ref_engine, ref)
    engine = LLMEngine(TEST_MODEL, num_gpu_blocks=128, block_size=4, async_scheduling=True)
    for rid, p in zip("abc", prompts):
        engine.add_request(rid, p, greedy(12))
    got: dict[str, list] = {}
    for _ in range(4):
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    assert engine.batch_queue.holds("a")  # "a" is in the step launched last, its token not back yet
    engine.abort_request("a")
    with pytest.raises(ValueError, match="request_id 'a' is already in use"):
        engine.add_request("a", prompts[0], greedy(3))  # not while a step in flight still holds it
    _drain(engine, got)
    tokens = {rid: [t for o in outs for t in o.outputs[0].token_ids] for rid, outs in got.items()}
    ref_tokens = {rid: [t for o in outs for t in o.outputs[0].token_ids] for rid, outs in ref.items()}
    assert got["a"][-1].finished and got["a"][-1].outputs[0].finish_reason == "abort"
    assert 1 <= len(tokens["a"]) < 12 and tokens["a"] == ref_tokens["a"][: len(tokens["a"])]
    assert tokens["b"] == ref_tokens["b"] and tokens["c"] == ref_tokens["c"]
    assert sum(o.finished for o in got["a"]) == 1  # the late token of the aborted step produced no output
    assert engine.scheduler.num_free_blocks == 128
    engine.add_request("a", prompts[0], greedy(3))  # once its last step is back, the id is free again
    again: dict[str, list] = {}
    _drain(engine, again)
    assert [t for o in again["a"] for t in o.outputs[0].token_ids] == ref_tokens["a"][:3]


def test_scheduling_overlaps_the_forward():
    """The forward runs in the worker thread, and schedule() of step N+1 starts before step N's forward ends.
    (The forward is slowed by a sleep so that the order does not depend on the machine's speed.)"""
    engine = LLMEngine(TEST_MODEL, num_gpu_blocks=256, async_scheduling=True)
    runner, sched = engine.model_runner, engine.scheduler
    forwards: list[tuple[float, float, str]] = []
    schedules: list[float] = []
    execute, schedule = runner.execute_model, sched.schedule

    def slow_execute(out):
        start = time.monotonic()
        time.sleep(0.02)
        res = execute(out)
        forwards.append((start, time.monotonic(), threading.current_thread().name))
        return res

    def timed_schedule():
        schedules.append(time.monotonic())
        return schedule()

    engine.batch_queue._execute_model = slow_execute
    sched.schedule = timed_schedule
    engine.add_request("r", make_prompts((8,))[0], greedy(6))
    _drain(engine, {})
    assert all(name.startswith("refengine-forward") for _, _, name in forwards)
    overlapped = [i for i, (start, end, _) in enumerate(forwards[:-1]) if start < schedules[i + 1] < end]
    assert len(overlapped) >= 4, (forwards, schedules)


@pytest.mark.parametrize(
    ("device", "given", "expected"),
    [
        ("cuda", None, True),  # the default: on where the host work it hides is real
        ("cuda:1", None, True),
        ("cpu", None, False),
        ("sim:h200", None, False),  # (the simulated tables keep their synchronous cost model)
        ("cuda", False, False),  # a value given is always honoured
        ("cpu", True, True),
    ],
)
def test_async_scheduling_default_follows_the_device(device, given, expected):
    from refengine.engine.engine_args import EngineArgs

    knobs = {} if given is None else {"async_scheduling": given}
    config = EngineArgs.from_kwargs(TEST_MODEL, device=device, **knobs).create_configs()
    assert config.scheduler.async_scheduling is expected


def test_a_cpu_engine_runs_sync_by_default_and_a_lone_scheduler_too():
    from refengine.config import SchedulerConfig
    from refengine.scheduler import Scheduler

    engine = LLMEngine(TEST_MODEL, num_gpu_blocks=64)
    assert engine.config.scheduler.async_scheduling is False and engine.batch_queue is None
    assert LLMEngine(TEST_MODEL, num_gpu_blocks=64, async_scheduling=True).batch_queue is not None
    assert not Scheduler(SchedulerConfig()).config.async_scheduling  # None: off, with no device to decide by
    with pytest.raises(ValueError, match="async_scheduling"):
        SchedulerConfig(async_scheduling="yes")
