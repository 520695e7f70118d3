"""Every sampled step's logits against a dense forward of the same tokens (conformance/dense_reference.py), where a
KV cache can go stale without a greedy token noticing: prefix-cache hits (identical prompts whose length is not a
multiple of the block size, sampled apart, preempted and readmitted; a multi-turn follow-up), swap preemption of
requests whose last block is partial, and recompute preemption whose re-prefill is chunked by a small budget.
Sync and async scheduling. Also that only a step reaching the end of the known tokens samples, and that the runner's
rows hold the scheduler's tokens after every step.
"""

from __future__ import annotations

import pytest

from conformance.dense_reference import (
    DENSE_LOGITS_ATOL,
    StepRecorder,
    check_against_dense,
    check_runner_tokens,
    hf_twin,
)
from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine, SamplingParams

BLOCK = 4
MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def _engine(recorder: StepRecorder, **knobs) -> LLMEngine:
    engine = LLMEngine(TEST_MODEL, sampler=recorder.sample, block_size=BLOCK, max_model_len=256, **knobs)
    recorder.install(engine)
    return engine


def _drain(engine: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            return tokens
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
    raise AssertionError("the engine did not finish its requests")


def _check(recorder: StepRecorder) -> None:
    checked, worst = check_against_dense(recorder, hf_twin(TEST_MODEL))
    assert checked > 0 and worst <= DENSE_LOGITS_ATOL
    assert check_runner_tokens(recorder) > 0


@MODES
def test_prefix_cache_hits_attend_to_the_kv_of_their_own_tokens(async_scheduling):
    """Four requests with one 10-token prompt (blocks of 4: the third block is partial), each sampling with its own
    seed so that their outputs, and so the third block's tokens, differ; a pool too small for all four preempts and
    readmits them through the prefix cache. Then a follow-up whose prompt is the first prompt plus its output."""
    rec = StepRecorder()
    engine = _engine(rec, num_gpu_blocks=12, enable_prefix_caching=True, async_scheduling=async_scheduling)
    prompt = make_prompts((10,), seed=3)[0]
    for i in range(4):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=i, ignore_eos=True))
    first = _drain(engine)
    engine.add_request("follow-up", prompt + first["r0"] + [101, 102, 103], greedy(4))
    _drain(engine)
    assert engine.scheduler.num_preemptions > 0, "the pool was sized to preempt"
    assert len({tuple(t) for t in first.values()}) > 1, "the seeds were chosen to make the outputs differ"
    assert sum(r.num_cached_tokens for r in engine.finished_requests) > 0, "meant to hit the prefix cache"
    _check(rec)


@MODES
def test_swapped_in_requests_attend_to_the_kv_they_had(async_scheduling):
    rec = StepRecorder()
    engine = _engine(
        rec,
        num_gpu_blocks=12,
        num_cpu_blocks=64,
        preemption_mode="swap",
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    for i, p in enumerate(make_prompts((10, 11, 9, 13), seed=1)):
        engine.add_request(f"r{i}", p, greedy(20, ignore_eos=True))
    _drain(engine)
    swapped = [n for step in rec.steps for n in step.swapped_out.values()]
    assert any(n % BLOCK for n in swapped), f"meant to swap out a request with a partial block: {swapped}"
    _check(rec)


@MODES
def test_a_chunked_re_prefill_after_recompute_samples_only_at_its_end(async_scheduling):
    rec = StepRecorder()
    engine = _engine(
        rec,
        num_gpu_blocks=12,
        max_num_batched_tokens=6,
        preemption_mode="recompute",
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    prompts = make_prompts((10, 11, 9, 13), seed=1)
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, greedy(20, ignore_eos=True))
    _drain(engine)
    past_prompt = [
        (rid, row.context, row.known)
        for step in rec.steps
        for rid, row in step.rows.items()
        if row.request.num_prompt_tokens < row.context < row.known
    ]
    assert past_prompt, "meant to chunk a re-prefill so that a chunk ends past the prompt, before the known tokens"
    _check(rec)
