"""Tests written for mutants that the recorded vLLM traces or their area's subset let survive (docs/mutation.md).
`python -m conformance.mutate` runs this file for those mutants (`KILL_TESTS` in conformance/mutants/mutant.py).

The traces cannot see the scheduler ones: their fake sampler masks EOS until min_tokens (as vLLM's does), never sets
ignore_eos, and their records do not carry the recompute metric. Those tests drive refengine's Scheduler directly,
feeding the tokens a caller of update_from_output may feed; the stop string before min_tokens drives the
detokenizer alone; the last two run the tiny model's engine: async scheduling under preemption with DELTA outputs,
and a stop string that must finish its request in the scheduler too.
"""

from __future__ import annotations

from refengine.engine.detokenizer import IncrementalDetokenizer
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler
from refengine.tokenizer import QwenTokenizer

EOS = 0


def _step(sched: Scheduler, token: int) -> list[str]:
    """One schedule() + update_from_output() feeding `token` to every request that samples."""
    out = sched.schedule()
    sampled = {
        rid: [token]
        for rid in out.num_scheduled_tokens
        if sched.requests[rid].num_computed_tokens >= sched.requests[rid].num_tokens
    }
    return [r.request_id for r in sched.update_from_output(out, sampled)]


def _request(rid: str, prompt: list[int], **sp) -> Request:
    return Request(rid, prompt, SamplingParams(temperature=0.0, **sp))


def test_eos_as_the_min_tokens_th_output_stops():
    """min_tokens=2: the second output may be EOS and stops the request (vLLM's check_stop counts the outputs so
    far, EOS included, against min_tokens)."""
    sched = Scheduler(eos_token_id=EOS, block_size=4, num_gpu_blocks=8)
    req = _request("r0", [5, 6, 7], max_tokens=8, min_tokens=2)
    sched.add_request(req)
    assert _step(sched, 9) == []
    assert _step(sched, EOS) == ["r0"]
    assert (req.num_output_tokens, req.status) == (2, RequestStatus.FINISHED_STOPPED)


def test_ignore_eos_runs_to_max_tokens():
    sched = Scheduler(eos_token_id=EOS, block_size=4, num_gpu_blocks=8)
    req = _request("r0", [5, 6, 7], max_tokens=3, ignore_eos=True)
    sched.add_request(req)
    finished = [_step(sched, EOS) for _ in range(3)]
    assert finished == [[], [], ["r0"]]
    assert (req.num_output_tokens, req.status) == (3, RequestStatus.FINISHED_LENGTH_CAPPED)


def test_recompute_preemption_counts_the_recomputed_tokens():
    """Without prefix caching, a request preempted by recompute computes again every token it had computed: the
    perf suite's num_recomputed_tokens must count them."""
    sched = Scheduler(
        eos_token_id=EOS, block_size=2, num_gpu_blocks=3, enable_prefix_caching=False, max_num_batched_tokens=16
    )
    reqs = [_request(f"r{i}", [10 + i, 20 + i], max_tokens=3) for i in range(2)]
    for r in reqs:
        sched.add_request(r)
    lost = 0
    for _ in range(30):
        before = {r.request_id: r.num_computed_tokens for r in reqs}
        out = sched.schedule()
        lost += sum(before[rid] for rid in out.preempted_req_ids)
        sampled = {
            rid: [7]
            for rid in out.num_scheduled_tokens
            if sched.requests[rid].num_computed_tokens >= sched.requests[rid].num_tokens
        }
        sched.update_from_output(out, sampled)
        if not sched.has_unfinished_requests():
            break
    assert sched.num_preemptions > 0 and lost > 0, "the pool was sized to force a recompute preemption"
    assert sum(r.num_recomputed_tokens for r in reqs) == lost


def test_stop_string_before_min_tokens_does_not_stop():
    """vLLM looks for stop strings only once min_tokens are out: "fox" in the first tokens, with min_tokens the
    whole output, leaves the request running and the text whole."""
    body = "The fox ran home."
    ids = QwenTokenizer().encode(body)
    req = Request("r0", [1, 2, 3], SamplingParams(max_tokens=len(ids), min_tokens=len(ids), stop=["fox"]))
    detok = IncrementalDetokenizer(QwenTokenizer(), req)
    text = []
    for i, tok in enumerate(ids):
        req.append_output_token_ids([tok])
        assert detok.update() is None, f"stopped at output {i + 1} of min_tokens {len(ids)}"
        text.append(detok.take_delta(finished=i == len(ids) - 1))
    assert "".join(text) == body and detok.stopped_by is None


def _deltas(engine, prompts, max_tokens: int) -> dict[str, list]:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    got: dict[str, list] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    return got


def test_async_preempted_request_streams_on_to_its_end():
    """Async scheduling, DELTA outputs, a KV pool too small for every request: a request preempted while its step
    is in flight still gets that step's token, and its output then is not a finished one; its stream goes on to
    max_tokens, with the tokens of the sync engine and exactly one finished output, its last."""
    from conformance.engine_helpers import make_prompts
    from refengine import LLMEngine

    prompts, max_tokens = make_prompts((9, 13, 7, 11), seed=3), 12
    knobs = dict(num_gpu_blocks=12, block_size=4)  # 4 requests need up to 6 blocks each: preemptions
    ref = _deltas(LLMEngine("tiny-qwen2", **knobs), prompts, max_tokens)
    engine = LLMEngine("tiny-qwen2", async_scheduling=True, **knobs)
    got = _deltas(engine, prompts, max_tokens)
    assert engine.scheduler.num_preemptions > 0, "the pool was sized to force preemptions"
    for rid, outs in ref.items():
        tokens = [t for o in got[rid] for t in o.outputs[0].token_ids]
        assert [o.finished for o in got[rid]].count(True) == 1 and got[rid][-1].finished, rid
        assert tokens == [t for o in outs for t in o.outputs[0].token_ids] and len(tokens) == max_tokens, rid


def test_a_stop_string_finishes_the_request_in_the_scheduler_too():
    """The step whose text shows a stop string hands back the request's final output, and the request is gone from
    the scheduler then: nothing left to run, its blocks free, no further step scheduling it to max_tokens."""
    from conformance.engine_helpers import make_prompts
    from refengine import LLMEngine

    prompt = make_prompts((9,), seed=3)[0]
    engine = LLMEngine("tiny-qwen2", num_gpu_blocks=64, block_size=4)
    free = engine.scheduler.num_free_blocks
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request("probe", prompt, params)
    stop = "".join(o.outputs[0].text for _ in range(4) for o in engine.step())  # the text of its first two tokens
    assert stop and not engine.has_unfinished_requests()
    engine.add_request("r0", prompt, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop]))
    for _ in range(30):
        outs = engine.step()
        if outs and outs[-1].finished:
            break
    assert outs[-1].outputs[0].finish_reason == "stop" and len(outs[-1].outputs[0].token_ids) <= 2
    assert not engine.has_unfinished_requests() and engine.scheduler.num_free_blocks == free
    assert engine.step() == []


def test_min_tokens_one_masks_the_first_output():
    """min_tokens=1: the first output may not be a stop token (vLLM masks while fewer than min_tokens are out), so
    with its greedy first token as a stop token id the request gives another first token, and goes on."""
    from refengine import LLM

    llm = LLM("tiny-qwen2", num_gpu_blocks=64)
    prompt = [1000, 2000, 3000]
    first = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))[0].outputs[0].token_ids[0]
    sp = SamplingParams(max_tokens=4, temperature=0.0, min_tokens=1, stop_token_ids=[first])
    out = llm.generate([prompt], sp)[0].outputs[0]
    assert out.token_ids[0] != first and len(out.token_ids) >= 2, out.token_ids


def test_top_p_keeps_the_token_that_crosses_the_nucleus():
    """vLLM's top-p keeps the smallest set of most likely tokens whose mass reaches top_p: with probabilities
    (0.5, 0.3, 0.2) and top_p 0.6 that is the first two (0.5 alone falls short), never the third."""
    import torch

    from refengine.sample.sampler import SamplingMetadata, sample

    n = 2000  # P(token 1 never drawn) = 0.625**2000: a correct sampler cannot miss it
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log().repeat(n, 1)
    md = SamplingMetadata(all_greedy=False, temperature=torch.ones(n), top_p=torch.full((n,), 0.6))
    drawn = sample(logits, md, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {0, 1}
