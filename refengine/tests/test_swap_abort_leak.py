"""Swap preemption leaves no host block behind: a request swapped back in and then aborted (or finished) before any
further step must not keep the host blocks its swap-in read from, or an idle engine holds them for good.
Also checks that the KV manager's own check_invariants() says so (the host pool holds only swapped-out KV)."""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine

NUM_GPU_BLOCKS = 12  # four prompts of ~10 tokens growing to 40 tokens in blocks of 4: swap preemptions
NUM_CPU_BLOCKS = 64
BLOCK = 4
MAX_TOKENS = 30
MAX_STEPS = 300


def _swapping_engine(async_scheduling: bool) -> LLMEngine:
    engine = LLMEngine(
        TEST_MODEL,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        num_cpu_blocks=NUM_CPU_BLOCKS,
        block_size=BLOCK,
        max_model_len=256,
        preemption_mode="swap",
        async_scheduling=async_scheduling,
    )
    for i, p in enumerate(make_prompts((10, 11, 9, 12), seed=1)):
        engine.add_request(f"r{i}", p, greedy(MAX_TOKENS, ignore_eos=True))
    return engine


def _host_used(engine: LLMEngine) -> int:
    return engine.scheduler.kv_cache_manager.host_pool.num_used_blocks


def _swap_in_steps(engine: LLMEngine) -> int:
    """Steps until one swaps a request back in (the runner is told so by blocks_to_swap_in)."""
    seen = {"n": 0}
    real = engine.model_runner.execute_model

    def execute_model(out):
        seen["n"] += bool(out.blocks_to_swap_in)
        return real(out)

    engine.model_runner.execute_model = execute_model
    if engine.batch_queue is not None:
        engine.batch_queue._execute_model = execute_model
    for step in range(MAX_STEPS):
        engine.step()
        engine.scheduler.check_invariants()
        if seen["n"]:
            return step
    raise AssertionError("no swap-in happened: the test no longer exercises swap")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_abort_right_after_swap_in_leaves_the_host_pool_empty(async_scheduling):
    engine = _swapping_engine(async_scheduling)
    _swap_in_steps(engine)
    engine.abort_request(list(engine.scheduler.requests))
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_swap_outs > 0
    assert _host_used(engine) == 0, f"{_host_used(engine)} host blocks held by an idle engine"
    assert engine.scheduler.num_free_blocks == NUM_GPU_BLOCKS
    engine.scheduler.check_invariants()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_host_pool_holds_only_swapped_out_kv_after_every_step(async_scheduling):
    """Run to the end with swaps; after every step the host pool holds exactly the swapped-out requests' blocks."""
    engine = _swapping_engine(async_scheduling)
    kv = engine.scheduler.kv_cache_manager
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        assert _host_used(engine) == sum(len(h) for h in kv.swapped.values())
    assert not engine.has_unfinished_requests()
    assert engine.scheduler.num_swap_outs > 0
    assert _host_used(engine) == 0


def test_kv_manager_check_invariants_catches_a_stray_host_block():
    engine = _swapping_engine(False)
    engine.scheduler.kv_cache_manager.host_pool.get_new_blocks(1)  # held by no swapped-out request
    with pytest.raises(AssertionError, match="host blocks used"):
        engine.scheduler.check_invariants()
