"""The engine's layers meet at their interfaces: Scheduler(config) and make_stats(), the batching and policy enums,
LLMEngine.add_requests (all or nothing), the constructor seams (model, sampler, detokenizer factory), stop strings
finished through the scheduler, and the admission limits shared with perf's feasibility check."""

from __future__ import annotations

import pytest
import torch

from refengine import LLMEngine, SamplingParams
from refengine.config import BatchingMode, SchedulerConfig, SchedulingPolicy
from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.engine.engine_args import EngineArgs
from refengine.limits import cdiv, check_request_fits
from refengine.request import Request, RequestStatus
from refengine.sample.sampler import sample
from refengine.scheduler import Scheduler

SMALL = dict(max_num_seqs=4, num_gpu_blocks=64, block_size=4, max_model_len=256)


def _req(rid: str, n: int, max_tokens: int = 4) -> Request:
    prompt = [10 * ord(rid[0]) + i for i in range(n)]  # (distinct per request: no prefix-cache hits)
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), arrival_time=0.0)


def _run_static(sched: Scheduler, steps: int) -> list:
    seen = []
    for _ in range(steps):
        out = sched.schedule()
        sampled = {
            rid: [7]
            for rid in out.num_scheduled_tokens
            if sched.requests[rid].num_computed_tokens == sched.requests[rid].num_tokens
        }
        sched.update_from_output(out, sampled)
        seen.append(sched.make_stats(out))
    return seen


def test_scheduler_takes_a_config_or_its_fields() -> None:
    config = SchedulerConfig(max_num_batched_tokens=12, max_num_seqs=2, block_size=4, num_gpu_blocks=16)
    by_object, by_keyword = (
        Scheduler(config),
        Scheduler(max_num_batched_tokens=12, max_num_seqs=2, block_size=4, num_gpu_blocks=16),
    )
    assert by_object.config == by_keyword.config and by_object.config is config
    for s in (by_object, by_keyword):
        s.add_request(_req("a", 10))
        s.add_request(_req("b", 10))
        assert dict(s.schedule().num_scheduled_tokens) == {"a": 10, "b": 2}
    with pytest.raises(ValueError, match="not both"):
        Scheduler(config, block_size=8)


def test_mode_and_policy_are_enums_given_as_strings() -> None:
    c = SchedulerConfig(batching="static", policy="priority")
    assert c.batching is BatchingMode.STATIC and c.policy is SchedulingPolicy.PRIORITY
    assert c.batching == "static" and f"{c.policy}" == "priority"  # (what the CLI and CSVs print)
    with pytest.raises(ValueError, match="batching"):
        SchedulerConfig(batching="dynamic")


def test_make_stats_reports_blocks_preemptions_and_static_batches() -> None:
    sched = Scheduler(max_num_batched_tokens=64, block_size=4, num_gpu_blocks=16, max_num_seqs=2, batching="static")
    for rid in ("a", "b", "c"):
        sched.add_request(_req(rid, 6, max_tokens=2 if rid == "a" else 3))
    stats = _run_static(sched, 1)[0]
    # a and b hold ceil((6 + 2 - 1) / 4) = 2 and ceil((6 + 3 - 1) / 4) = 2 blocks (static reserves the whole length)
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_used_blocks) == (2, 1, 4)
    assert stats.kv_cache_usage == pytest.approx(4 / 16) and stats.num_free_blocks == 12
    assert stats.static_batch_id == 1 and stats.batch_ids == {"a": 1, "b": 1}
    later = _run_static(sched, 4)
    # a finishes first, but its slot stays held until b has finished; then c forms batch 2
    assert [s.batch_ids for s in later] == [{"a": 1, "b": 1}, {"b": 1}, {"c": 2}, {"c": 2}]
    assert later[0].num_running_reqs == 1 and later[2].static_batch_id == 2


def test_make_stats_counts_preemptions_and_prefix_hits() -> None:
    sched = Scheduler(max_num_batched_tokens=64, block_size=4, num_gpu_blocks=4, max_num_seqs=4)
    sched.add_request(_req("a", 8, max_tokens=8))
    sched.add_request(_req("b", 7, max_tokens=8))
    out = sched.schedule()
    sched.update_from_output(out, {"a": [9], "b": [9]})
    out = sched.schedule()  # a needs a third block: b (the last admitted) is preempted
    stats = sched.make_stats(out)
    assert stats.num_preemptions == 1 and out.preempted_req_ids == ["b"]
    assert stats.prefix_cache_queries == 15 and stats.prefix_cache_hits == 0
    assert stats.batch_ids == {"a": None}  # (continuous: no batches)


def test_a_readmissions_prefix_lookup_is_counted_apart() -> None:
    """As vLLM's PrefixCacheStats: the lookup of a request readmitted after a recompute preemption (which often hits
    its own freed blocks) is counted in preempted_queries / preempted_hits, so that prefix_cache_hits /
    prefix_cache_queries stays the hit rate of first admissions."""
    sched = Scheduler(
        max_num_batched_tokens=64, block_size=4, num_gpu_blocks=4, max_num_seqs=4, enable_prefix_caching=True
    )
    sched.add_request(_req("a", 8, max_tokens=2))
    sched.add_request(_req("b", 7, max_tokens=8))
    sched.update_from_output(sched.schedule(), {"a": [9], "b": [9]})
    out = sched.schedule()  # a needs a third block: b is preempted, its full first block stays cached
    assert out.preempted_req_ids == ["b"]
    sched.update_from_output(out, {"a": [9]})  # a finishes (max_tokens 2)
    out = sched.schedule()  # b is readmitted: of its 8 tokens, its own first block (4) is a hit
    assert out.num_scheduled_tokens == {"b": 4}
    stats = sched.make_stats(out)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (15, 0)
    assert (stats.prefix_cache_preempted_queries, stats.prefix_cache_preempted_hits) == (8, 4)


def test_add_requests_is_all_or_nothing() -> None:
    engine = LLMEngine("tiny-qwen2", **SMALL)
    good = ("r0", [11, 12, 13], SamplingParams(max_tokens=2))
    bad = ("r1", [11, 10**9])  # a token id outside the vocabulary
    with pytest.raises(ValueError, match=r"^request 1: prompt_token_ids holds token id"):
        engine.add_requests([good, bad, ("r2", [5])])
    assert not engine.has_unfinished_requests() and engine.get_num_unfinished_requests() == 0
    with pytest.raises(ValueError, match="request 1: request_id 'r0' is already in use"):
        engine.add_requests([good, good])
    assert engine.get_num_unfinished_requests() == 0
    queued = engine.add_requests([good, ("r1", "hello", None, None, 2)])
    assert [r.request_id for r in queued] == ["r0", "r1"] and queued[1].priority == 2
    assert engine.get_num_unfinished_requests() == 2


class _ConstantModel(torch.nn.Module):
    """Stands in for CausalLM: every position's logits favour token 42."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.hidden, self.vocab = hidden, vocab

    def forward(self, input_ids, positions, kv_caches, attn_metadata) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(hidden.shape[0], self.vocab)
        logits[:, 42] = 1.0
        return logits


def test_model_sampler_and_detokenizer_are_passed_in() -> None:
    from refengine.models.presets import load_model_config

    mc = load_model_config("tiny-qwen2")
    calls = {"sample": 0, "detok": 0}

    def counting_sample(logits, md, generator):
        calls["sample"] += 1
        return sample(logits, md, generator)

    def detokenizer(tokenizer, request):
        calls["detok"] += 1
        return IncrementalDetokenizer(tokenizer, request)

    engine = LLMEngine(
        "tiny-qwen2",
        model_impl=_ConstantModel(mc.hidden_size, mc.vocab_size),
        sampler=counting_sample,
        detokenizer_factory=detokenizer,
        **SMALL,
    )
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0.0))
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens += out.outputs[0].token_ids
    assert tokens == [42, 42, 42] and calls == {"sample": 3, "detok": 1}


def test_stop_string_finishes_through_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = LLMEngine("tiny-qwen2", **SMALL)
    finished = []
    real = Scheduler.finish_requests

    def spy(self, request_ids, status=RequestStatus.FINISHED_ABORTED):
        finished.append((list(request_ids), status))
        return real(self, request_ids, status)

    monkeypatch.setattr(Scheduler, "finish_requests", spy)
    text = engine.tokenizer.decode(engine.tokenizer.encode(" the the the the"))
    engine.add_request("r", text, SamplingParams(max_tokens=30, temperature=0.0, seed=0))
    first = []
    while engine.has_unfinished_requests() and not first:
        first = [o.outputs[0].text for o in engine.step() if o.outputs[0].text]
    stop = first[0][:1]  # the first character it generates: a stop string met at once
    engine.add_request("s", text, SamplingParams(max_tokens=30, temperature=0.0, seed=0, stop=[stop]))
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "s"]
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "stop"
    assert outs[-1].outputs[0].stop_reason == stop
    assert (["s"], RequestStatus.FINISHED_STOPPED) in finished


def test_engine_args_sorts_knobs_into_typed_configs() -> None:
    cfg = EngineArgs.from_kwargs("tiny-qwen2", seed=3, batching="sequence", max_num_seqs=None).create_configs()
    assert cfg.seed == 3 and isinstance(cfg.scheduler, SchedulerConfig)
    assert cfg.scheduler.batching is BatchingMode.SEQUENCE and cfg.scheduler.max_num_seqs == 256  # None: default
    with pytest.raises(ValueError, match="unknown engine option"):
        EngineArgs.from_kwargs("tiny-qwen2", max_num_seq=3)


@pytest.mark.parametrize(
    "prompt, max_tokens, knobs, match",
    [
        (10, 5, dict(max_model_len=10), "max_model_len"),
        (10, 30, dict(num_gpu_blocks=2), "num_gpu_blocks=2"),
        (10, 30, dict(enable_chunked_prefill=False, max_num_batched_tokens=16), "max_num_batched_tokens=16"),
        (10, 30, dict(), None),
    ],
)
def test_check_request_fits(prompt: int, max_tokens: int, knobs: dict, match: str | None) -> None:
    limits = (
        dict(
            max_model_len=1000,
            block_size=16,
            num_gpu_blocks=100,
            enable_chunked_prefill=True,
            max_num_batched_tokens=64,
        )
        | knobs
    )
    if match is None:
        check_request_fits(prompt, max_tokens, **limits)
        return
    with pytest.raises(ValueError, match=match):
        check_request_fits(prompt, max_tokens, **limits)
    assert cdiv(39, 16) == 3 and cdiv(32, 16) == 2


def test_the_scheduler_refuses_an_empty_prompt_and_keeps_the_others() -> None:
    """Model-free, a request with no prompt token could never be scheduled nor finish (has_unfinished_requests would
    hold for ever): add_request refuses it naming the field, queues nothing, and the others still run."""
    from refengine.request import Request
    from refengine.scheduler import Scheduler

    sched = Scheduler(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_gpu_blocks=8)
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        sched.add_request(Request("empty", [], SamplingParams(max_tokens=2)))
    assert not sched.has_unfinished_requests() and "empty" not in sched.requests
    sched.add_request(Request("ok", [1, 2, 3], SamplingParams(max_tokens=1)))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"ok": 3}
    assert [r.request_id for r in sched.update_from_output(out, {"ok": [7]})] == ["ok"]
    assert not sched.has_unfinished_requests()
