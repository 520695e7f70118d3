"""Every scheduling behaviour of docs/scheduling.md, end to end on the real tiny model: batching modes, preemption by
recompute and swap, prefix caching, policies, finish conditions, seeded sampling and bad input."""

from __future__ import annotations

import pytest

from conformance.engine_helpers import TEST_MODEL, greedy, make_prompts, run_llm
from refengine import LLM, LLMEngine, SamplingParams

LENS = (1, 5, 16, 17, 40, 90)
MAX_TOKENS = (30, 36, 24, 30, 28, 32)
BLOCK = 4
# The longest request needs ceil((90 + 32 - 1) / 4) = 31 blocks; all together need 88. 36 blocks fit each
# request alone but not their decodes together, so the engine must preempt.
TIGHT_BLOCKS = 36


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(LENS, seed=7)


@pytest.fixture(scope="module")
def reference(prompts):
    tokens, _ = run_llm(prompts, MAX_TOKENS, block_size=BLOCK, max_num_batched_tokens=64, num_gpu_blocks=1024)
    return tokens


@pytest.mark.parametrize("batching", ["continuous", "sequence", "static", "none"])
def test_greedy_identical_across_batching_modes(prompts, reference, batching):
    tokens, llm = run_llm(
        prompts,
        MAX_TOKENS,
        block_size=BLOCK,
        max_num_batched_tokens=32,
        max_num_seqs=3,
        num_gpu_blocks=1024,
        batching=batching,
    )
    assert tokens == reference
    assert llm.llm_engine.scheduler.num_preemptions == 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("caching", [True, False])
def test_greedy_identical_under_preemption(prompts, reference, mode, caching):
    tokens, llm = run_llm(
        prompts,
        MAX_TOKENS,
        block_size=BLOCK,
        max_num_batched_tokens=64,
        num_gpu_blocks=TIGHT_BLOCKS,
        num_cpu_blocks=64,
        preemption_mode=mode,
        enable_prefix_caching=caching,
    )
    sched = llm.llm_engine.scheduler
    assert sched.num_preemptions > 0, "the KV pool was meant to force preemptions"
    recomputed = sum(r.num_recomputed_tokens for r in llm.llm_engine.finished_requests)
    if mode == "swap":
        assert sched.num_swap_outs == sched.num_preemptions  # the 64-block host pool never fills
        assert recomputed == 0
    else:
        assert sched.num_swap_outs == 0
        assert recomputed > 0
    assert tokens == reference
    assert sched.num_free_blocks == TIGHT_BLOCKS
    assert sched.kv_cache_manager.host_pool.num_free_blocks == sched.config.num_cpu_blocks
    per_request = sum(r.num_preemptions for r in llm.llm_engine.finished_requests)
    assert per_request == sched.num_preemptions


def test_swap_falls_back_to_recompute_when_host_pool_is_full(prompts, reference):
    tokens, llm = run_llm(
        prompts,
        MAX_TOKENS,
        block_size=BLOCK,
        max_num_batched_tokens=64,
        num_gpu_blocks=TIGHT_BLOCKS,
        num_cpu_blocks=2,
        preemption_mode="swap",
    )
    sched = llm.llm_engine.scheduler
    assert sched.num_preemptions > sched.num_swap_outs  # some victims did not fit in 2 host blocks
    assert tokens == reference


def test_prefix_cache_hits_and_changes_nothing():
    shared = make_prompts((48,), seed=11)[0]
    tails = make_prompts((3, 9, 14), seed=12)
    prompts = [shared + t for t in tails]
    on, llm_on = run_llm(
        prompts, (6, 6, 6), block_size=BLOCK, max_num_batched_tokens=128, num_gpu_blocks=256, max_num_seqs=1
    )  # one at a time, so later requests find the first one's blocks
    off, llm_off = run_llm(
        prompts,
        (6, 6, 6),
        block_size=BLOCK,
        max_num_batched_tokens=128,
        num_gpu_blocks=256,
        max_num_seqs=1,
        enable_prefix_caching=False,
    )
    assert on == off
    cached_on = [r.num_cached_tokens for r in llm_on.llm_engine.finished_requests]
    cached_off = [r.num_cached_tokens for r in llm_off.llm_engine.finished_requests]
    assert cached_on == [0, 48, 48]
    assert cached_off == [0, 0, 0]


def test_persistent_batch_writes_rows_only_on_admission(prompts):
    _, llm = run_llm(
        prompts, MAX_TOKENS, block_size=BLOCK, max_num_batched_tokens=32, max_num_seqs=3, num_gpu_blocks=1024
    )
    batch = llm.llm_engine.model_runner.input_batch
    assert batch.num_row_writes == len(prompts)  # not once per step
    assert len(batch.row_of) + len(batch.free_rows) == 3  # rows are reused, never more than max_num_seqs
    assert len(batch.row_of) <= 1  # only the last request's row waits for the next step to be released


def _admissions(llm: LLM) -> list[tuple[int, set[str], set[str]]]:
    """(step, running before, newly running) for every step that admitted someone."""
    stats, seen, out = llm.llm_engine.step_stats, set(), []
    prev: set[str] = set()
    for i, s in enumerate(stats):
        running = set(s.running_req_ids) | set(s.scheduled_req_ids)
        new = running - seen
        if new:
            out.append((i, prev, new))
        seen |= running
        prev = set(s.running_req_ids)
    return out


def test_static_mode_admits_only_when_the_batch_has_finished(prompts):
    _, llm = run_llm(
        prompts,
        MAX_TOKENS,
        block_size=BLOCK,
        max_num_batched_tokens=256,
        max_num_seqs=3,
        num_gpu_blocks=1024,
        batching="static",
    )
    admissions = _admissions(llm)
    assert len(admissions) == 2  # 6 requests in batches of 3
    for step, running_before, new in admissions:
        assert not running_before, f"step {step} admitted {new} while {running_before} still ran"
        assert len(new) == 3


def test_none_mode_runs_one_request_at_a_time(prompts):
    _, llm = run_llm(
        prompts, MAX_TOKENS, block_size=BLOCK, max_num_batched_tokens=256, num_gpu_blocks=1024, batching="none"
    )
    assert max(len(s.running_req_ids) for s in llm.llm_engine.step_stats) == 1
    assert len(_admissions(llm)) == len(prompts)


def test_sequence_mode_never_mixes_prefill_and_decode(prompts):
    _, llm = run_llm(
        prompts,
        MAX_TOKENS,
        block_size=BLOCK,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        num_gpu_blocks=1024,
        batching="sequence",
    )
    steps = llm.llm_engine.step_stats
    assert all(s.num_prefill_tokens == 0 or s.num_decode_tokens == 0 for s in steps)
    assert any(s.num_prefill_tokens for s in steps) and any(s.num_decode_tokens for s in steps)


def test_priority_preemption_lets_an_urgent_request_in(prompts, reference):
    engine = LLMEngine(
        TEST_MODEL,
        block_size=BLOCK,
        max_num_batched_tokens=64,
        max_num_seqs=2,
        num_gpu_blocks=1024,
        policy="priority",
        priority_preemption=True,
    )
    engine.add_request("low0", prompts[4], greedy(MAX_TOKENS[4]), priority=5)
    engine.add_request("low1", prompts[5], greedy(MAX_TOKENS[5]), priority=5)
    got: dict[str, list[int]] = {}
    first_token_step: dict[str, int] = {}
    step = 0
    while engine.has_unfinished_requests():
        if step == 3:
            engine.add_request("urgent", prompts[1], greedy(MAX_TOKENS[1]), priority=0)
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.outputs[0].token_ids)
            first_token_step.setdefault(out.request_id, step)
        step += 1
    assert first_token_step["urgent"] == 3  # admitted at once, not after a low-priority request finished
    assert engine.scheduler.num_preemptions >= 1
    assert got["urgent"] == reference[1] and got["low0"] == reference[4] and got["low1"] == reference[5]


# ---- finish conditions ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_llm():
    return LLM(TEST_MODEL, num_gpu_blocks=512, max_num_batched_tokens=256)


def test_stop_string_cuts_text_not_tokens(text_llm):
    base = text_llm.generate(["Once upon a time"], greedy(24))[0].outputs[0]
    assert len(base.text) > 12
    stop = base.text[6:10]
    cut = text_llm.generate(["Once upon a time"], greedy(24, stop=[stop]))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == base.text[: base.text.find(stop)]
    assert cut.token_ids == base.token_ids[: len(cut.token_ids)]  # the tokens are kept, including the last one
    assert text_llm.llm_engine.tokenizer.decode(cut.token_ids).find(stop) >= 0
    kept = text_llm.generate(["Once upon a time"], greedy(24, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.outputs[0].text == base.text[: base.text.find(stop) + len(stop)]


def test_stop_token_ids_and_min_tokens(text_llm):
    base = text_llm.generate(["Hello there"], greedy(12))[0].outputs[0]
    first = base.token_ids[0]
    stopped = text_llm.generate(["Hello there"], greedy(12, stop_token_ids=[first]))[0].outputs[0]
    assert stopped.token_ids == [first] and stopped.finish_reason == "stop" and stopped.stop_reason == first
    held = text_llm.generate(["Hello there"], greedy(12, stop_token_ids=[first], min_tokens=5))[0].outputs[0]
    assert len(held.token_ids) >= 5
    assert first not in held.token_ids[:5]  # masked until min_tokens
    length = text_llm.generate(["Hello there"], greedy(4))[0].outputs[0]
    assert length.finish_reason == "length" and len(length.token_ids) == 4


def test_eos_finishes_unless_ignored():
    """A random-weight model rarely samples the real EOS, so the request's EOS set is pointed at the token greedy
    decoding is known to produce first: the request stops on it (kept in token_ids), unless ignore_eos."""
    llm = LLM(TEST_MODEL, num_gpu_blocks=256)
    prompt = [1000, 2000, 3000]
    first = llm.generate([prompt], greedy(3))[0].outputs[0].token_ids[0]
    engine = llm.llm_engine
    for rid, params in (("e", greedy(3)), ("i", greedy(3, ignore_eos=True))):
        engine.add_request(rid, prompt, params)
        engine.scheduler.requests[rid].eos_token_ids = frozenset([first])
        outs = []
        while engine.has_unfinished_requests():
            outs += engine.step()
        last = outs[-1].outputs[0]
        tokens = [t for o in outs for t in o.outputs[0].token_ids]
        if rid == "e":
            assert last.finish_reason == "stop" and last.stop_reason is None and tokens == [first]
        else:
            assert last.finish_reason == "length" and len(tokens) == 3 and tokens[0] == first


def test_abort_mid_generation_returns_blocks():
    engine = LLMEngine(TEST_MODEL, num_gpu_blocks=128, block_size=4)
    engine.add_request("a", make_prompts((30,))[0], greedy(40))
    engine.add_request("b", make_prompts((10,), seed=1)[0], greedy(5))
    got: dict[str, list] = {}
    for _ in range(4):
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    engine.abort_request("a")
    while engine.has_unfinished_requests():
        for out in engine.step():
            got.setdefault(out.request_id, []).append(out)
    assert got["a"][-1].finished and got["a"][-1].outputs[0].finish_reason == "abort"
    assert sum(len(o.outputs[0].token_ids) for o in got["a"]) >= 2
    assert got["b"][-1].outputs[0].finish_reason == "length"
    assert engine.scheduler.num_free_blocks == 128


# ---- seeded sampling -----------------------------------------------------------------------------------------
def test_seeded_sampling_reproducible_across_batches_and_preemption(prompts):
    sp = SamplingParams(max_tokens=10, temperature=0.9, top_k=50, top_p=0.9, seed=1234)
    alone = LLM(TEST_MODEL, num_gpu_blocks=512, block_size=BLOCK).generate([prompts[4]], sp)[0].outputs[0].token_ids
    others = [SamplingParams(max_tokens=m, temperature=1.0) for m in MAX_TOKENS]
    crowd_llm = LLM(TEST_MODEL, num_gpu_blocks=TIGHT_BLOCKS, block_size=BLOCK, max_num_batched_tokens=64)
    outs = crowd_llm.generate(prompts + [prompts[4]], others + [sp])
    assert crowd_llm.llm_engine.scheduler.num_preemptions > 0
    assert outs[-1].outputs[0].token_ids == alone
    greedy_tokens = LLM(TEST_MODEL, num_gpu_blocks=512).generate([prompts[4]], greedy(10))[0].outputs[0].token_ids
    assert alone != greedy_tokens  # it really sampled
    other_seed = SamplingParams(max_tokens=10, temperature=0.9, top_k=50, top_p=0.9, seed=99)
    assert LLM(TEST_MODEL, num_gpu_blocks=512).generate([prompts[4]], other_seed)[0].outputs[0].token_ids != alone
