"""Swap preemption copies every block that holds computed KV to the host and back, the partial last block too:
left behind, that block's KV is whatever the device block held when the request was swapped back in.
"""

from __future__ import annotations

import pytest
import torch

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine, SamplingParams
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.limits import cdiv
from refengine.request import Request

BLOCK = 4
# what the test writes into a device block once its KV is swapped out: finite (attention reads whole blocks, and a
# NaN in a block's masked tail would poison every later request that gets the block) but far from any real KV
GARBAGE = 50.0


@pytest.mark.parametrize("num_computed", range(1, 13))
def test_the_swap_plans_cover_every_computed_block(num_computed):
    kv = KVCacheManager(num_gpu_blocks=8, block_size=BLOCK, enable_prefix_caching=False, num_cpu_blocks=8)
    req = Request("r", list(range(100, 113)), SamplingParams(max_tokens=4))
    assert kv.allocate_slots(req, num_computed) is not None
    req.num_computed_tokens = num_computed
    held = kv.get_block_ids("r")
    out = kv.swap_out(req)
    assert out is not None
    assert [d for d, _ in out] == held[: cdiv(num_computed, BLOCK)], "a block holding computed KV stayed behind"
    back = kv.swap_in(req, 1, 0, reserve=False)
    assert back is not None
    assert [h for h, _ in back] == [h for _, h in out], "the swap-in does not bring back every swapped-out block"


def _tokens(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    raise AssertionError("the engine did not finish its requests")


def _spoil_swapped_out_blocks(engine: LLMEngine) -> list[int]:
    """After each swap-out copy, overwrite the device blocks it copied from (as another request's KV would); returns
    the list the number of spoiled blocks is appended to, per swap-out."""
    runner = engine.model_runner
    real_swap_out, spoiled = runner._swap_out, []

    def swap_out(plan: list[tuple[int, int]]) -> None:
        real_swap_out(plan)  # (the copies are gathered here; they land in the host cache later)
        if plan:
            src = torch.tensor([d for d, _ in plan])
            for k, v in runner.kv_caches:
                k[src] = GARBAGE
                v[src] = -GARBAGE
            spoiled.append(len(plan))

    runner._swap_out = swap_out
    return spoiled


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_swapped_in_request_does_not_read_the_device_blocks_it_left(async_scheduling):
    """Four requests whose prompts leave a partial block, in a pool that swaps them out and back in, with every
    swapped-out device block overwritten: each request's greedy tokens equal those of a pool that never swaps."""
    prompts = make_prompts((10, 11, 9, 13), seed=1)
    engine = LLMEngine(
        TEST_MODEL,
        block_size=BLOCK,
        num_gpu_blocks=12,
        num_cpu_blocks=64,
        max_model_len=256,
        preemption_mode="swap",
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    spoiled = _spoil_swapped_out_blocks(engine)
    roomy = LLMEngine(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=128, max_model_len=256)
    for e in (engine, roomy):
        for i, p in enumerate(prompts):
            e.add_request(f"r{i}", p, greedy(20, ignore_eos=True))
    got, want = _tokens(engine), _tokens(roomy)
    assert spoiled and roomy.scheduler.num_preemptions == 0, "meant to swap in one engine and not in the other"
    assert got == want
