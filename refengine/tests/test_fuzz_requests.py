"""Fuzz: whatever a caller puts in SamplingParams, the prompt and add_request's other arguments, either it is
rejected with a ValueError (and nothing changes), or the request runs to the end without an error. No input may
make step() raise, make another request fail, or leak a KV block. One small engine serves every example, so each
also checks that the engine goes on serving after the ones before it.

Bounded by the Hypothesis profile (conftest.py): a third / a quarter of its max_examples, so `ci` runs 33 + 25
examples (each a few steps of the tiny model, ~20 s in all here) and CBBENCH_HYPOTHESIS_PROFILE=thorough 500 + 375.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.engine_helpers import TEST_MODEL
from refengine import LLMEngine, SamplingParams
from refengine.models.presets import PRESETS

NUM_BLOCKS = 16
BLOCK = 4
MAX_MODEL_LEN = 48
VOCAB = PRESETS[TEST_MODEL].vocab_size
REQUEST_EXAMPLES = max(10, settings.default.max_examples // 3)  # (conftest.py loaded the profile before this import)
CONFIG_EXAMPLES = max(10, settings.default.max_examples // 4)  # each builds an engine: dearer

# Values of every kind, weighted toward the edges where crashes live.
_ints = st.one_of(
    st.integers(-3, 20),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**20, VOCAB - 1, VOCAB, 200_000]),
    st.integers(),
)
_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-30, 1e-5, 1.0, 1e30, math.nan, math.inf, -math.inf]),
)
_junk = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.lists(st.integers(0, 5), max_size=2))
_any = st.one_of(_ints, _floats, _junk)
_token_lists = st.lists(st.one_of(st.integers(0, VOCAB - 1), _ints), max_size=3)

_FIELDS = {
    "max_tokens": st.one_of(st.integers(1, 6), _any),
    "min_tokens": st.one_of(st.integers(0, 4), _any),
    "temperature": st.one_of(st.floats(0, 2), _any),
    "top_p": st.one_of(st.floats(0, 1), _any),
    "top_k": st.one_of(st.integers(-1, 50), _any),
    "seed": st.one_of(st.none(), _ints, _any),
    "stop": st.one_of(st.none(), st.text(max_size=3), st.lists(st.text(max_size=3), max_size=2), _any),
    "stop_token_ids": st.one_of(st.none(), _token_lists, _any),
    "ignore_eos": st.one_of(st.booleans(), _any),
    "include_stop_str_in_output": st.one_of(st.booleans(), _any),
    "n": st.one_of(st.just(1), _any),
    "presence_penalty": st.one_of(st.floats(-2, 2), _any),
    "frequency_penalty": st.one_of(st.floats(-2, 2), _any),
    "repetition_penalty": st.one_of(st.floats(0.1, 3), _any),
    "min_p": st.one_of(st.floats(0, 1), _any),
    "logprobs": st.one_of(st.none(), _any),  # a vLLM-only field: refused unless at its default
}
_prompts = st.one_of(
    st.text(min_size=0, max_size=20),
    st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=60),
    st.lists(st.one_of(st.integers(0, VOCAB - 1), _ints, _floats, st.booleans()), max_size=8),
    st.fixed_dictionaries({"prompt": st.text(max_size=10)}),
    st.fixed_dictionaries({"prompt_token_ids": st.lists(st.integers(0, 1000), max_size=8)}),
    _any,
)
_request = st.fixed_dictionaries(
    {
        "prompt": _prompts,
        "params": st.fixed_dictionaries({}, optional=_FIELDS),  # any subset of the fields
        "arrival_time": st.one_of(st.none(), st.floats(0, 1e9), _any),
        "priority": st.one_of(st.integers(-5, 5), _any),
    }
)


@pytest.fixture(scope="module")
def engine():
    return LLMEngine(
        TEST_MODEL,
        num_gpu_blocks=NUM_BLOCKS,
        block_size=BLOCK,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        policy="priority",
    )


def _add(engine: LLMEngine, rid: str, spec: dict) -> bool:
    """True if the request was accepted; a rejection must be a ValueError and leave nothing queued."""
    before = set(engine.scheduler.requests)
    try:
        params = SamplingParams(**spec["params"])
        engine.add_request(rid, spec["prompt"], params, arrival_time=spec["arrival_time"], priority=spec["priority"])
    except ValueError as e:
        assert str(e), "a ValueError must say what is wrong"
        assert set(engine.scheduler.requests) == before, "a rejected request changed the engine"
        return False
    return True


@settings(max_examples=REQUEST_EXAMPLES)
@given(batch=st.lists(_request, min_size=1, max_size=4))
def test_accepted_requests_run_to_the_end(engine, batch):
    accepted = [f"f{i}" for i, spec in enumerate(batch) if _add(engine, f"f{i}", spec)]
    finished: dict[str, object] = {}
    tokens: list[int] = []
    steps = 0
    while engine.has_unfinished_requests():
        steps += 1
        assert steps < 10 * MAX_MODEL_LEN, "the engine stopped making progress"
        for out in engine.step():  # must not raise
            tokens += out.outputs[0].token_ids
            if out.finished:
                finished[out.request_id] = out.outputs[0]
    assert sorted(finished) == sorted(accepted)
    for rid, c in finished.items():
        assert c.error is None and c.finish_reason in ("stop", "length"), (rid, c)
    assert all(0 <= t < VOCAB for t in tokens)
    assert engine.scheduler.num_free_blocks == NUM_BLOCKS
    engine.scheduler.check_invariants()


_knobs = st.fixed_dictionaries(
    {},
    optional={
        "batching": st.sampled_from(["continuous", "sequence", "static", "none"]),
        "policy": st.sampled_from(["fcfs", "priority"]),
        "preemption_mode": st.sampled_from(["recompute", "swap"]),
        "num_cpu_blocks": st.integers(0, 8),
        "enable_chunked_prefill": st.booleans(),
        "enable_prefix_caching": st.booleans(),
        "long_prefill_token_threshold": st.integers(0, 8),
        "max_num_batched_tokens": st.integers(1, 64),
        "max_num_seqs": st.integers(1, 6),
        "block_size": st.sampled_from([1, 2, 4, 16]),
        "num_gpu_blocks": st.integers(1, 24),
        "max_model_len": st.integers(2, MAX_MODEL_LEN),
        "seed": st.one_of(st.integers(-(2**63), 2**63 - 1), _any),
        "stats_log_size": st.one_of(st.none(), st.integers(0, 3)),
        "async_scheduling": st.booleans(),
    },
)


@settings(max_examples=CONFIG_EXAMPLES)
@given(knobs=_knobs, batch=st.lists(_request, min_size=1, max_size=4), abort_at=st.integers(0, 6))
def test_any_engine_config_serves_what_it_accepts(knobs, batch, abort_at):
    """The same contract over random engine configurations (batching modes, swap, tiny KV pools, chunking off),
    with one accepted request aborted mid-run."""
    try:
        engine = LLMEngine(TEST_MODEL, **knobs)
    except ValueError:
        return
    accepted = [f"f{i}" for i, spec in enumerate(batch) if _add(engine, f"f{i}", spec)]
    finished: dict[str, object] = {}
    steps = 0
    while engine.has_unfinished_requests():
        if steps == abort_at and accepted:
            engine.abort_request(accepted[0])
        steps += 1
        assert steps < 20 * MAX_MODEL_LEN, "the engine stopped making progress"
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0]
    assert sorted(finished) == sorted(accepted)
    for rid, c in finished.items():
        assert c.error is None and c.finish_reason in ("stop", "length", "abort"), (rid, c)
    assert engine.scheduler.num_free_blocks == engine.scheduler.config.num_gpu_blocks
    engine.scheduler.check_invariants()
