"""vLLM's `cache_salt` and `reset_prefix_cache`, the two ways a benchmark keeps one run from being served from the
prefix cache an earlier run filled (cbbench perf's --prefix-cache-isolation, docs/perf.md).

The salt goes into the hash of a request's first KV block only; the chain of hashes carries it to every later block,
so salted and unsalted prefixes never match, two salts never match, and one salt matches itself (the prefixes a run
shares inside itself still hit). A reset forgets every cached prefix, and is refused (False, nothing changed) while a
request holds KV blocks, as vLLM's is without reset_running_requests.
"""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine, SamplingParams
from refengine.kv_cache.block_pool import hash_block_tokens
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.request import Request

BLOCK = 4
PROMPT_LEN = 18  # four full blocks and a partial one: a hit covers 16 tokens


def _hashes(tokens: list[int], salt: str | None) -> list[int]:
    kv = KVCacheManager(num_gpu_blocks=16, block_size=BLOCK, enable_prefix_caching=True)
    return list(kv.block_hashes(Request("r", tokens, SamplingParams(max_tokens=1), cache_salt=salt)))


def test_the_salt_changes_every_block_hash_through_the_first_block_alone():
    tokens = list(range(100, 100 + PROMPT_LEN))
    plain, salted, other = _hashes(tokens, None), _hashes(tokens, "run-1"), _hashes(tokens, "run-2")
    assert len(plain) == len(salted) == PROMPT_LEN // BLOCK
    assert all(a != b for a, b in zip(plain, salted)), "a salted block hashed as an unsalted one"
    assert all(a != b for a, b in zip(salted, other)), "two salts gave one hash"
    assert salted == _hashes(tokens, "run-1"), "one salt hashed two ways"
    # the salt is the first block's: every later block is chained to its parent as an unsalted one is
    assert salted[0] == hash_block_tokens(None, tokens[:BLOCK], "run-1")
    for i in range(1, len(salted)):
        assert salted[i] == hash_block_tokens(salted[i - 1], tokens[i * BLOCK : (i + 1) * BLOCK])


def _engine() -> LLMEngine:
    return LLMEngine(TEST_MODEL, block_size=BLOCK, num_gpu_blocks=64, max_model_len=128)


def _cached_tokens(engine: LLMEngine, prompt: object, request_id: str) -> int:
    """Run one request alone to the end; the prompt tokens its admission found in the prefix cache."""
    engine.add_request(request_id, prompt, greedy(2, ignore_eos=True))
    for _ in range(100):
        for out in engine.step():
            if out.finished:
                engine.scheduler.kv_cache_manager.check_invariants(engine.scheduler.requests)
                return int(out.metrics["num_cached_tokens"])
    raise AssertionError("the request did not finish")


def test_salted_and_unsalted_prefixes_never_match_and_one_salt_matches_itself():
    engine = _engine()
    ids = make_prompts((PROMPT_LEN,), seed=3)[0]
    full = PROMPT_LEN // BLOCK * BLOCK
    assert _cached_tokens(engine, ids, "plain") == 0
    assert _cached_tokens(engine, {"prompt_token_ids": ids, "cache_salt": "a"}, "a1") == 0
    assert _cached_tokens(engine, {"prompt_token_ids": ids, "cache_salt": "b"}, "b1") == 0
    assert _cached_tokens(engine, {"prompt_token_ids": ids, "cache_salt": "a"}, "a2") == full
    assert _cached_tokens(engine, ids, "plain2") == full  # the unsalted copy is still there
    # a longer prompt under the same salt hits the shared part (a run's shared prefixes still hit)
    longer = {"prompt_token_ids": ids + [5, 6, 7, 8], "cache_salt": "b"}
    assert _cached_tokens(engine, longer, "b2") == full


@pytest.mark.parametrize("salt", ["", 7, None, ["a"]], ids=["empty", "int", "null", "list"])
def test_a_bad_salt_is_refused_naming_the_field(salt):
    engine = _engine()
    with pytest.raises(ValueError, match="cache_salt"):
        engine.add_request("r", {"prompt_token_ids": [1, 2, 3], "cache_salt": salt}, greedy(2))
    assert not engine.has_unfinished_requests()


def test_reset_forgets_every_cached_prefix():
    engine = _engine()
    ids = make_prompts((PROMPT_LEN,), seed=5)[0]
    _cached_tokens(engine, ids, "first")
    assert _cached_tokens(engine, ids, "warm") > 0
    assert engine.reset_prefix_cache() is True
    engine.scheduler.kv_cache_manager.check_invariants()
    assert _cached_tokens(engine, ids, "cold") == 0


def test_reset_is_refused_while_a_request_holds_blocks():
    engine = _engine()
    ids = make_prompts((PROMPT_LEN,), seed=6)[0]
    _cached_tokens(engine, ids, "first")
    engine.add_request("running", make_prompts((9,), seed=7)[0], greedy(8, ignore_eos=True))
    engine.step()  # admitted: it holds blocks now
    assert engine.reset_prefix_cache() is False
    while engine.has_unfinished_requests():
        engine.step()
    assert _cached_tokens(engine, ids, "still-warm") == PROMPT_LEN // BLOCK * BLOCK  # the refusal changed nothing
    assert engine.reset_prefix_cache() is True
