"""Bad input raises ValueError naming what is wrong, changes nothing, and the engine keeps serving."""
from __future__ import annotations

import pytest

from conformance.engine_helpers import greedy
from refengine import LLMEngine, SamplingParams
from refengine.scheduler import Scheduler


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=1.5), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=9, max_tokens=4), "min_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(seed="x"), "seed"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
    ],
)
def test_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "knob, value",
    [("max_num_batched_tokens", 0), ("max_num_seqs", 0), ("block_size", 0), ("num_gpu_blocks", -1),
     ("preemption_mode", "drop"), ("policy", "lifo"), ("batching", "dynamic"), ("long_prefill_token_threshold", -1)],
)
def test_scheduler_knobs_name_the_field(knob, value):
    with pytest.raises(ValueError, match=knob):
        Scheduler(**{knob: value})


@pytest.fixture(scope="module")
def engine():
    return LLMEngine("tiny-qwen2", num_gpu_blocks=8, block_size=16, max_model_len=256)


@pytest.mark.parametrize(
    "prompt, params, needle",
    [
        ("", None, "prompt"),
        ([], None, "prompt_token_ids"),
        ([1, 2, 151936], None, "outside the vocabulary"),
        ([1, -1], None, "outside the vocabulary"),
        ([5] * 256, None, "max_model_len"),
        ([5] * 100, SamplingParams(max_tokens=100), r"needs 13 KV blocks of 16 tokens.*num_gpu_blocks=8"),
        ([1, "a"], None, "token ids"),
        (b"bytes", None, "prompt"),
    ],
)
def test_bad_prompts_are_rejected_and_the_engine_keeps_serving(engine, prompt, params, needle):
    engine.add_request("ok", [10, 20, 30], greedy(3))
    with pytest.raises(ValueError, match=needle):
        engine.add_request("bad", prompt, params)
    assert "bad" not in engine.scheduler.requests
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.request_id for o in outs if o.finished] == ["ok"]
    assert engine.scheduler.num_free_blocks == 8


def test_bad_request_fields(engine):
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("", [1, 2])
    with pytest.raises(ValueError, match="priority"):
        engine.add_request("p", [1, 2], greedy(2), priority="high")
    with pytest.raises(ValueError, match="params"):
        engine.add_request("p", [1, 2], {"max_tokens": 2})
    engine.add_request("dup", [1, 2], greedy(2))
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("dup", [3, 4], greedy(2))
    while engine.has_unfinished_requests():
        engine.step()


def test_unknown_engine_option_and_model():
    with pytest.raises(ValueError, match="unknown engine option"):
        LLMEngine("tiny-qwen2", max_num_batched_tokenz=4)
    with pytest.raises(ValueError, match="model"):
        LLMEngine("no-such-model-or-folder")


def test_prompt_too_long_for_one_step_without_chunked_prefill():
    engine = LLMEngine("tiny-qwen2", num_gpu_blocks=64, enable_chunked_prefill=False, max_num_batched_tokens=32)
    with pytest.raises(ValueError, match="enable_chunked_prefill=False"):
        engine.add_request("long", [7] * 30, greedy(8))
