"""Only full blocks enter the prefix cache. A partial block (a prompt whose length is not a multiple of the block
size) must not be hashed: its hash would not be recomputed once the block fills, so the block would sit in the
cache under the hash of fewer tokens. A follow-up turn (the first prompt plus its output) would then miss it, and a
request readmitted after a preemption, whose hashes were taken while its block was partial, would hit another
request's block holding other tokens.
"""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine, SamplingParams
from refengine.kv_cache.block_pool import hash_block_tokens
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.request import Request

BLOCK = 4
MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def test_a_partial_block_is_hashed_once_it_fills_and_not_before():
    kv = KVCacheManager(num_gpu_blocks=8, block_size=BLOCK, enable_prefix_caching=True)
    req = Request("r", list(range(100, 110)), SamplingParams(max_tokens=4))  # 10 tokens: 2 full blocks + 2
    hashes = kv.block_hashes(req)
    assert len(hashes) == 2
    kv.check_invariants({"r": req})
    req.append_output_token_ids((7, 8))  # the third block fills
    hashes = kv.block_hashes(req)
    assert hashes[2] == hash_block_tokens(hashes[1], [108, 109, 7, 8])
    kv.check_invariants({"r": req})


def _run(engine: LLMEngine) -> dict[str, tuple[list[int], int]]:
    """{request id: (output tokens, cached prompt tokens)}, checking the KV manager's invariants after every step."""
    done: dict[str, tuple[list[int], int]] = {}
    tokens: dict[str, list[int]] = {}
    kv, sched = engine.scheduler.kv_cache_manager, engine.scheduler
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            return done
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
            if out.finished:
                done[out.request_id] = (tokens[out.request_id], out.metrics["num_cached_tokens"])
        kv.check_invariants(sched.requests)
    raise AssertionError("the engine did not finish its requests")


@MODES
@pytest.mark.parametrize("prompt_len", [10, 13, 7])
def test_a_follow_up_turn_hits_every_full_block_the_first_turn_computed(prompt_len, async_scheduling):
    """Turn two's prompt is turn one's prompt and output plus three tokens: the prefix cache holds every full block
    of turn one's computed tokens (all but its last output, which was sampled and never fed back)."""
    engine = LLMEngine(
        TEST_MODEL, block_size=BLOCK, num_gpu_blocks=64, max_model_len=256, async_scheduling=async_scheduling
    )
    prompt = make_prompts((prompt_len,), seed=4)[0]
    engine.add_request("turn1", prompt, greedy(6, ignore_eos=True))
    first, _ = _run(engine)["turn1"]
    engine.add_request("turn2", prompt + first + [101, 102, 103], greedy(2))
    _, cached = _run(engine)["turn2"]
    computed = prompt_len + len(first) - 1
    assert cached == computed // BLOCK * BLOCK, f"turn two found {cached} tokens cached of turn one's {computed}"


def test_identical_prompts_run_together_each_keep_their_own_tokens():
    """Four requests with one 10-token prompt, each sampling with its own seed, in a pool that preempts and
    readmits them: each one's tokens equal its tokens run alone (a readmitted request that hits another one's
    block, filled with that request's tokens, samples from the wrong KV)."""
    prompt = make_prompts((10,), seed=3)[0]
    params = [SamplingParams(max_tokens=16, temperature=1.0, seed=i, ignore_eos=True) for i in range(4)]
    together = LLMEngine(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=12, max_model_len=256)
    for i, sp in enumerate(params):
        together.add_request(f"r{i}", prompt, sp)
    got = _run(together)
    assert together.scheduler.num_preemptions > 0, "the pool was sized to preempt"
    alone = LLMEngine(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=64, max_model_len=256)
    for i, sp in enumerate(params):
        alone.add_request(f"r{i}", prompt, sp)
        want, _ = _run(alone)[f"r{i}"]
        assert got[f"r{i}"][0] == want, f"r{i}: tokens run together differ from the same request run alone"
