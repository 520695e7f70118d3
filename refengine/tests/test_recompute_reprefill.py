"""After a recompute preemption a request computes its prompt and its outputs again; under a small token budget that
re-prefill is chunked. Only the chunk that reaches its last known token may sample: a chunk that ends past the
prompt but before the generated tokens samples nothing (a token there would be appended to the runner's row, which
would then run one token ahead of the scheduler's). Checked sync and async, on the runner's rows after every step.
"""

from __future__ import annotations

import pytest

from conformance.dense_reference import StepRecorder, check_runner_tokens
from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts
from refengine import LLMEngine

MODES = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def _engine(async_scheduling: bool, sampler=None) -> LLMEngine:
    engine = LLMEngine(
        TEST_MODEL,
        block_size=4,
        num_gpu_blocks=12,
        max_num_batched_tokens=6,  # a re-prefill of 20-odd tokens takes four chunks or more
        max_model_len=256,
        preemption_mode="recompute",
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
        **({"sampler": sampler} if sampler else {}),
    )
    for i, p in enumerate(make_prompts((10, 11, 9, 13), seed=1)):
        engine.add_request(f"r{i}", p, greedy(20, ignore_eos=True))
    return engine


def test_sync_the_runners_rows_equal_the_schedulers_tokens_after_every_step():
    engine = _engine(async_scheduling=False)
    sched, batch = engine.scheduler, engine.model_runner.input_batch
    compared = 0
    for step in range(1000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        for req in sched.running:
            if req.request_id in batch:
                assert batch.token_ids_of(req.request_id) == req.all_token_ids, f"step {step}: {req}"
                compared += 1
    assert sched.num_preemptions > 0 and compared > 0, "the pool was sized to preempt"


@MODES
def test_a_chunk_that_ends_before_the_last_known_token_samples_nothing(async_scheduling):
    rec = StepRecorder()
    engine = _engine(async_scheduling, sampler=rec.sample)
    rec.install(engine)
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    rows = [(i, rid, row) for i, s in enumerate(rec.steps) for rid, row in s.rows.items()]
    assert any(row.request.num_prompt_tokens < row.context < row.known for _, _, row in rows), (
        "meant to chunk a re-prefill so that a chunk ends past the prompt, before the known tokens"
    )
    for i, rid, row in rows:
        sampled = rid in rec.steps[i].sampled
        assert sampled == row.expect_sample, (
            f"step {i}, {rid}: computed {row.context} of {row.known} known tokens, sampled: {sampled}"
        )
    assert check_runner_tokens(rec) > 0
