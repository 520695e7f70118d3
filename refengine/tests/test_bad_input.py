"""Bad input raises ValueError naming what is wrong, changes nothing, and the engine keeps serving."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.engine_helpers import greedy
from refengine import LLM, LLMEngine, SamplingParams
from refengine.scheduler import Scheduler


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=1.5), "max_tokens"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(max_tokens="5"), "max_tokens"),
        (dict(max_tokens=None), "max_tokens"),
        (dict(min_tokens=-1), "min_tokens"),
        (dict(min_tokens=1.0), "min_tokens"),
        (dict(min_tokens=9, max_tokens=4), "min_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(temperature="0"), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(top_p=True), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_k=None), "top_k"),
        (dict(seed="x"), "seed"),
        (dict(seed=2**64), "seed"),
        (dict(seed=2**63), "seed"),
        (dict(seed=-(2**63) - 1), "seed"),
        (dict(seed=1.0), "seed"),
        (dict(seed=True), "seed"),
        (dict(stop=[""]), "stop"),
        (dict(stop=""), "stop"),
        (dict(stop=5), "stop"),
        (dict(stop=[5]), "stop"),
        (dict(stop=["a", None]), "stop"),
        (dict(stop=b"x"), "stop"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
        (dict(stop_token_ids=5), "stop_token_ids"),
        (dict(stop_token_ids="12"), "stop_token_ids"),
        (dict(stop_token_ids=[1.5]), "stop_token_ids"),
        (dict(stop_token_ids=[True]), "stop_token_ids"),
        (dict(stop_token_ids=[None]), "stop_token_ids"),
        (dict(ignore_eos="no"), "ignore_eos"),
        (dict(ignore_eos=1), "ignore_eos"),
        (dict(ignore_eos=None), "ignore_eos"),
        (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output"),
        (dict(n=2), "n must be 1"),
        (dict(n=0), "n must be 1"),
        (dict(n="1"), "n must be an integer"),
        (dict(extra="x"), "extra"),
    ],
)
def test_sampling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "knob, value",
    [
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 1.5),
        ("max_num_batched_tokens", "8"),
        ("max_num_seqs", 0),
        ("max_num_seqs", 10**6),
        ("max_num_seqs", True),
        ("block_size", 0),
        ("block_size", 16.0),
        ("num_gpu_blocks", -1),
        ("num_gpu_blocks", None),
        ("num_cpu_blocks", -1),
        ("num_cpu_blocks", "0"),
        ("preemption_mode", "drop"),
        ("preemption_mode", 1),
        ("policy", "lifo"),
        ("policy", ["fcfs"]),
        ("batching", "dynamic"),
        ("long_prefill_token_threshold", -1),
        ("long_prefill_token_threshold", 0.5),
        ("enable_chunked_prefill", "yes"),
        ("enable_prefix_caching", 1),
        ("priority_preemption", "x"),
        ("max_model_len", 1),
    ],
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


def _serves(engine, n: int = 3) -> None:
    """After bad input the same engine still serves a good request to the end, and frees its blocks."""
    engine.add_request("good", [10, 20, 30], greedy(n))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    last = [o for o in outs if o.request_id == "good"][-1]
    assert last.finished and last.outputs[0].finish_reason == "length" and last.outputs[0].error is None
    assert sum(len(o.outputs[0].token_ids) for o in outs if o.request_id == "good") == n
    assert engine.scheduler.num_free_blocks == engine.scheduler.config.num_gpu_blocks


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(arrival_time="x"), "arrival_time"),
        (dict(arrival_time=float("nan")), "arrival_time"),
        (dict(arrival_time=float("inf")), "arrival_time"),
        (dict(arrival_time=True), "arrival_time"),
        (dict(arrival_time=[1.0]), "arrival_time"),
        (dict(priority="high"), "priority"),
        (dict(priority=1.5), "priority"),
        (dict(priority=True), "priority"),
        (dict(priority=None), "priority"),
        (dict(priority=2**64), "priority"),
        (dict(request_id=None), "request_id"),
        (dict(request_id=5), "request_id"),
        (dict(params={"max_tokens": 2}), "params"),
        (dict(params=SamplingParams(stop_token_ids=[200000], min_tokens=2)), "stop_token_ids"),
        (dict(params=SamplingParams(stop_token_ids=[151936])), "stop_token_ids"),
        (dict(prompt={"prompt": ""}), "prompt"),
        (dict(prompt={"foo": [1]}), "prompt"),
        (dict(prompt={"prompt_token_ids": "abc"}), "prompt_token_ids"),
        (dict(prompt={"prompt_token_ids": [1, 151936]}), "outside the vocabulary"),
        (dict(prompt=[1.0, 2.0]), "prompt"),
        (dict(prompt=[True, 2]), "prompt"),
        (dict(prompt=None), "prompt"),
        (dict(prompt=7), "prompt"),
    ],
)
def test_bad_request_fields_name_the_field(engine, kwargs, field):
    args = dict(request_id="bad", prompt=[1, 2, 3], params=greedy(2)) | kwargs
    rid, prompt, params = args.pop("request_id"), args.pop("prompt"), args.pop("params")
    with pytest.raises(ValueError, match=field):
        engine.add_request(rid, prompt, params, **args)
    assert not engine.scheduler.requests and not engine.has_unfinished_requests()
    _serves(engine)


def test_params_changed_after_construction_are_checked_again_and_copied(engine):
    sp = greedy(3)
    sp.seed = 2**64  # skips __post_init__: add_request must check again
    with pytest.raises(ValueError, match="seed"):
        engine.add_request("bad", [1, 2, 3], sp)
    sp = SamplingParams(max_tokens=3, seed=1)
    engine.add_request("mutated", [1, 2, 3], sp)
    sp.seed, sp.top_k, sp.stop_token_ids = 2**64, 10**20, [10**9]  # after queuing: the engine holds its own copy
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.outputs[0].error is None
    _serves(engine)


# Accepted values at their extremes: each must run to the end without error (these used to crash step()).
ACCEPTED = [
    dict(seed=2**63 - 1),
    dict(seed=-(2**63)),
    dict(seed=0),
    dict(top_k=10**20),
    dict(top_k=151936),
    dict(top_k=-1),
    dict(top_k=1),
    dict(stop_token_ids=[151935], min_tokens=2),
    dict(stop_token_ids=(0, 5)),
    dict(temperature=1e30),
    dict(temperature=1e-30),
    dict(top_p=1e-30),
    dict(stop=("a", "b")),
    dict(stop="."),
    dict(max_tokens=np.int64(3), seed=np.int64(7)),
    dict(temperature=np.float32(0.5)),
]


def test_extreme_but_valid_params_run_to_the_end(engine):
    for i, kw in enumerate(ACCEPTED):
        kw = {"max_tokens": 3} | kw
        engine.add_request(f"x{i}", [5, 6, 7], SamplingParams(**kw))
    engine.add_request("dict-text", {"prompt": "Hello"}, greedy(2))
    engine.add_request("dict-ids", {"prompt_token_ids": (np.int64(4), 5)}, greedy(2), arrival_time=np.float64(1.0))
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out.outputs[0]
    assert len(finished) == len(ACCEPTED) + 2
    for rid, c in finished.items():
        assert c.error is None and c.finish_reason in ("stop", "length"), (rid, c)
    assert engine.scheduler.num_free_blocks == 8


@pytest.mark.parametrize("bad", [None, 5, ["ok", 3], {"a": 1}])
def test_abort_request_names_request_id(engine, bad):
    with pytest.raises(ValueError, match="request_id"):
        engine.abort_request(bad)
    engine.abort_request("no-such-request")  # unknown ids are ignored, as in vLLM
    _serves(engine)


def test_llm_generate_is_atomic():
    llm = LLM("tiny-qwen2", num_gpu_blocks=8, max_model_len=256)
    engine = llm.llm_engine
    bad_cases = [
        ([[1, 2, 3], [1, 151936]], greedy(2), "prompt 1: .*outside the vocabulary"),
        ([[1, 2, 3], [4, 5]], [greedy(2), {"max_tokens": 2}], "prompt 1: params"),
        ([[1, 2, 3], [4, 5]], [greedy(2)], "sampling_params has 1 entries"),
        ([[1, 2, 3], [4, 5]], greedy(2), "priority"),
        (5, greedy(2), "prompts"),
    ]
    for prompts, params, needle in bad_cases:
        kw = {"priority": [0]} if needle == "priority" else {}
        with pytest.raises(ValueError, match=needle):
            llm.generate(prompts, params, **kw)
        assert not engine.has_unfinished_requests() and not engine.scheduler.requests
    outs = llm.generate([[1, 2, 3], {"prompt_token_ids": [4, 5]}], greedy(2))
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 2]
    assert llm.generate([]) == []
