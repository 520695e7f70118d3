"""Named example tests of the scheduling rules: the worked examples and the rules of docs/scheduling.md one at a
time, and our own versions of scenarios from vLLM's tests/v1/core/test_scheduler.py. All go through the adapter (`--engine`), so
they state what any conforming scheduler must do; tests of a knob an engine lacks skip via its `supports()`.
"""

from __future__ import annotations

import pytest

from conformance.adapters import expect_known_difference
from conformance.fake_runner import EOS_TOKEN_ID

TOK = 5  # an ordinary sampled token


def make(adapter_cls, **knobs):
    knobs.setdefault("enable_prefix_caching", False)
    supports = getattr(adapter_cls, "supports", None)
    why = supports(knobs) if supports is not None else None
    if why:
        pytest.skip(why)
    return adapter_cls(eos_token_id=EOS_TOKEN_ID, **knobs)


def step(a, tokens: dict[str, int] | None = None):
    """schedule + sample (TOK, or tokens[rid]) for the requests whose prompt is wholly computed + update."""
    out = a.schedule()
    sampled = {}
    for rid in out.num_scheduled_tokens:
        v = a.request(rid)
        sampled[rid] = [(tokens or {}).get(rid, TOK)] if v.num_computed_tokens == v.num_tokens else []
    return out, set(a.update(sampled))


def prompt(n: int, start: int = 1000) -> list[int]:
    return list(range(start, start + n))


# ---- the worked examples ------------------------------------------------------------------------------------------
def test_seed_chunked_prefill_8192_16_decodes_12000_prompt(adapter_cls):
    """Budget 8192, 16 running decodes and one 12000-token prompt: 16 + 8176, then 16 + 3824, then it decodes."""
    a = make(adapter_cls, max_num_batched_tokens=8192, max_num_seqs=256, block_size=16, num_gpu_blocks=1024)
    for i in range(16):
        a.add_request(f"d{i}", prompt(8, 10 * i), max_tokens=100, arrival_time=i)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {f"d{i}": 8 for i in range(16)}
    a.add_request("long", prompt(12000, 50_000), max_tokens=10, arrival_time=100)
    out, _ = step(a)
    assert [out.num_scheduled_tokens[f"d{i}"] for i in range(16)] == [1] * 16
    assert out.num_scheduled_tokens["long"] == 8176 and sum(out.num_scheduled_tokens.values()) == 8192
    out, _ = step(a)
    assert out.num_scheduled_tokens["long"] == 3824 and sum(out.num_scheduled_tokens.values()) == 16 + 3824
    assert a.request("long").num_output_tokens == 1  # the last chunk samples the first token
    out, _ = step(a)
    assert out.num_scheduled_tokens == {**{f"d{i}": 1 for i in range(16)}, "long": 1}


def test_finished_request_leaves_and_waiting_joins_in_the_same_step(adapter_cls):
    a = make(adapter_cls, max_num_seqs=2, block_size=4, num_gpu_blocks=64)
    for i, rid in enumerate(["r0", "r1", "r2"]):
        a.add_request(rid, prompt(6, 100 * i), max_tokens=20, arrival_time=i)
    out, _ = step(a)
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}  # max_num_seqs
    out, finished = step(a, {"r0": EOS_TOKEN_ID})
    assert finished == {"r0"} and a.request("r0").finish_reason == "stop"
    assert a.request("r0").block_ids == []  # its blocks went back at once
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"r1": 1, "r2": 6}  # r1 decodes, r2 joins, in one step
    assert out.new_req_ids == ["r2"]


def test_recompute_keeps_generated_tokens_and_reprefills_them(adapter_cls):
    # 4 blocks of 4: two 6-token prompts hold 2 blocks each; the first one to need a 3rd block preempts the other
    # max_num_seqs within the budget, which vLLM's config requires (two requests: it never binds)
    a = make(
        adapter_cls,
        block_size=4,
        num_gpu_blocks=4,
        max_num_batched_tokens=64,
        max_num_seqs=8,
        preemption_mode="recompute",
    )
    a.add_request("r0", prompt(6), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    step(a)  # both prefilled, 1 token each: 7 tokens, 6 computed
    step(a)  # decode: 8 tokens, 7 computed, 2 blocks each
    step(a)  # decode: 9 tokens, 8 computed, 2 full blocks each
    out, _ = step(a)  # r0 needs a 3rd block for its 9th token: r1 (most recently admitted) is preempted
    assert out.preempted_req_ids == ["r1"] and out.num_scheduled_tokens == {"r0": 1}
    r1 = a.request("r1")
    assert (r1.status, r1.num_computed_tokens, r1.num_output_tokens, r1.block_ids) == ("preempted", 0, 3, [])
    while a.request("r0").status != "finished":
        out, _ = step(a)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"r1": 6 + 3}  # prompt + the 3 generated tokens, re-prefilled at once
    assert a.request("r1").num_output_tokens == 4


def test_swap_preemption_round_trip_keeps_num_computed(adapter_cls):
    a = make(adapter_cls, block_size=4, num_gpu_blocks=4, num_cpu_blocks=8, preemption_mode="swap")
    a.add_request("r0", prompt(6), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    for _ in range(3):
        step(a)
    held = a.request("r1").block_ids
    out, _ = step(a)
    assert out.preempted_req_ids == ["r1"]
    assert [d for d, _ in out.blocks_to_swap_out] == held
    r1 = a.request("r1")
    assert (r1.num_computed_tokens, r1.num_output_tokens, r1.block_ids) == (8, 3, [])
    host = [h for _, h in out.blocks_to_swap_out]
    while a.request("r0").status != "finished":
        step(a)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"r1": 1}  # no re-prefill: it decodes on from its swapped-in KV
    assert [h for h, _ in out.blocks_to_swap_in] == host
    assert [d for _, d in out.blocks_to_swap_in] == a.request("r1").block_ids[: len(host)]


def test_swap_with_full_host_pool_falls_back_to_recompute(adapter_cls):
    a = make(adapter_cls, block_size=4, num_gpu_blocks=4, num_cpu_blocks=1, preemption_mode="swap")
    a.add_request("r0", prompt(6), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    for _ in range(3):
        step(a)
    out, _ = step(a)  # r1's 2 blocks do not fit 1 host block
    assert out.preempted_req_ids == ["r1"] and out.blocks_to_swap_out == []
    assert a.request("r1").num_computed_tokens == 0 and a.request("r1").num_output_tokens == 3


# ---- prefix caching -----------------------------------------------------------------------------------------------
def test_prefix_hit_never_covers_the_last_token(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "blocks_of_a_finishing_step_cached")
    a = make(adapter_cls, block_size=4, num_gpu_blocks=16, enable_prefix_caching=True)
    a.add_request("a", prompt(8), max_tokens=1, arrival_time=0)
    step(a)  # 8 tokens = 2 full blocks, cached; finished (max_tokens 1)
    a.add_request("b", prompt(8), max_tokens=1, arrival_time=1)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"b": 4}  # one block hit; the block holding the last token is recomputed
    a.add_request("c", prompt(9), max_tokens=1, arrival_time=2)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"c": 1}  # both full blocks hit, the 9th token is computed


def _lru_setup(adapter_cls):
    """bs 4, 8 blocks. A (9 tokens: A0 A1 full, A2 partial) finishes, then B (B0 B1 B2) finishes. Freed blocks that
    can never be hit (the partial A2, B2) are reused first, then never-used ones, then cached blocks least recently
    freed first, tail first. C (17 tokens) takes 5 blocks: B2, the 3 never-used ones left, then A1 (A0 stays)."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=8, enable_prefix_caching=True)
    a.add_request("A", prompt(9, 1000), max_tokens=1, arrival_time=0)
    step(a)
    a.add_request("B", prompt(9, 2000), max_tokens=1, arrival_time=1)
    step(a)
    a.add_request("C", prompt(17, 3000), max_tokens=10, arrival_time=2)
    step(a)
    return a


def test_lru_evicts_least_recently_freed_blocks_first(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "blocks_of_a_finishing_step_cached", "lru_eviction")
    a = _lru_setup(adapter_cls)
    a.add_request("A2", prompt(9, 1000), max_tokens=1, arrival_time=3)
    out, _ = step(a)
    assert out.num_scheduled_tokens["A2"] == 9 - 4  # A1 was evicted by C, A0 (freed last of A's) is still cached


def test_lru_keeps_the_most_recently_freed_blocks(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "blocks_of_a_finishing_step_cached", "lru_eviction")
    a = _lru_setup(adapter_cls)
    a.add_request("B2", prompt(9, 2000), max_tokens=1, arrival_time=3)
    out, _ = step(a)
    assert out.num_scheduled_tokens["B2"] == 1  # B, freed after A, kept both full blocks


# ---- policies and modes -------------------------------------------------------------------------------------------
def test_priority_preempts_the_largest_priority_arrival(adapter_cls):
    a = make(adapter_cls, block_size=4, num_gpu_blocks=6, policy="priority")
    for rid, prio, t in [("r0", 0, 0), ("r1", 2, 1), ("r2", 1, 2)]:
        a.add_request(rid, prompt(6, 1000 * (t + 1)), max_tokens=8, priority=prio, arrival_time=t)
    for _ in range(3):
        step(a)
    out, _ = step(a)  # r0 needs a 3rd block: the victim is r1 (priority 2), not r2, the most recently admitted
    assert out.preempted_req_ids == ["r1"]
    assert [v.request_id for v in a.running()] == ["r0", "r2"]


def test_chunked_prefill_off_stops_admission_at_head_of_line(adapter_cls):
    a = make(
        adapter_cls,
        max_num_batched_tokens=10,
        max_num_seqs=8,  # within the budget, as vLLM's config requires; three requests, so it never binds
        block_size=4,
        num_gpu_blocks=32,
        enable_chunked_prefill=False,
    )
    a.add_request("r0", prompt(4), max_tokens=20, arrival_time=0)
    step(a)
    a.add_request("big", prompt(10, 2000), max_tokens=1, arrival_time=1)
    a.add_request("small", prompt(2, 3000), max_tokens=1, arrival_time=2)
    out, _ = step(a)  # r0's decode leaves 9 < 10: "big" may not be split, and "small" may not pass it
    assert out.num_scheduled_tokens == {"r0": 1}
    assert [v.request_id for v in a.waiting()] == ["big", "small"]


def test_static_batch_admits_nothing_until_the_whole_batch_finished(adapter_cls):
    a = make(adapter_cls, batching="static", max_num_seqs=4, block_size=4, num_gpu_blocks=32)
    a.add_request("short", prompt(4), max_tokens=1, arrival_time=0)
    a.add_request("long", prompt(4, 2000), max_tokens=4, arrival_time=1)
    step(a)
    assert a.request("short").status == "finished"
    a.add_request("late", prompt(4, 3000), max_tokens=1, arrival_time=2)
    for _ in range(3):  # "long" decodes its 3 remaining tokens alone: its slot-mate's slot stays empty
        out, _ = step(a)
        assert out.num_scheduled_tokens == {"long": 1}
    assert a.request("long").status == "finished"
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"late": 4}


def test_sequence_mode_prefills_in_steps_of_their_own(adapter_cls):
    a = make(adapter_cls, batching="sequence", block_size=4, num_gpu_blocks=32)
    a.add_request("r0", prompt(4), max_tokens=10, arrival_time=0)
    step(a)
    a.add_request("r1", prompt(6, 2000), max_tokens=10, arrival_time=1)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"r1": 6}  # a prefill step: r0 does not decode in it
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"r0": 1, "r1": 1}


# ---- in the style of vLLM's tests/v1/core/test_scheduler.py (our own versions) ------------------------------------
def test_vllm_style_schedule_admits_all_in_order(adapter_cls):
    a = make(adapter_cls, block_size=16, num_gpu_blocks=1000)
    for i in range(10):
        a.add_request(str(i), prompt(16 + i, 100 * i), max_tokens=16, arrival_time=i)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {str(i): 16 + i for i in range(10)}
    assert [v.request_id for v in a.running()] == [str(i) for i in range(10)] and a.waiting() == []


def test_vllm_style_concurrent_partial_prefills_with_threshold(adapter_cls):
    a = make(
        adapter_cls, max_num_batched_tokens=1024, long_prefill_token_threshold=400, block_size=16, num_gpu_blocks=1000
    )
    for i in range(3):
        a.add_request(str(i), prompt(800, 1000 * i), max_tokens=16, arrival_time=i)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"0": 400, "1": 400, "2": 224}
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"0": 1, "1": 1, "2": 352}


def test_vllm_style_preempt_when_kv_is_full(adapter_cls):
    a = make(adapter_cls, max_num_batched_tokens=200, max_num_seqs=8, block_size=16, num_gpu_blocks=10)
    a.add_request("0", prompt(80), max_tokens=16, arrival_time=0)
    a.add_request("1", prompt(80, 2000), max_tokens=16, arrival_time=1)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"0": 80, "1": 80}
    assert [len(a.request(r).block_ids) for r in "01"] == [5, 5]
    out, _ = step(a)  # "0" needs a 6th block for its 81st token: "1" is preempted
    assert out.preempted_req_ids == ["1"] and out.num_scheduled_tokens == {"0": 1}
    assert a.request("1").status == "preempted" and a.request("1").num_output_tokens == 1


@pytest.mark.parametrize("case", ["eos", "stop_token", "max_tokens", "ignore_eos", "min_tokens"])
def test_vllm_style_stop_via_update(request, adapter_cls, case):
    a = make(adapter_cls, block_size=4, num_gpu_blocks=64)
    kw = dict(max_tokens=10)
    if case == "stop_token":
        kw["stop_token_ids"] = [42]
    if case == "max_tokens":
        kw["max_tokens"] = 2
    if case == "ignore_eos":
        kw["ignore_eos"] = True
    if case == "min_tokens":
        kw["min_tokens"] = 3
        expect_known_difference(request, adapter_cls, "eos_before_min_tokens")
    a.add_request("r", prompt(4), **kw)
    a.add_request("other", prompt(4, 2000), max_tokens=10)
    first = {
        "eos": EOS_TOKEN_ID,
        "stop_token": 42,
        "max_tokens": 10,
        "ignore_eos": EOS_TOKEN_ID,
        "min_tokens": EOS_TOKEN_ID,
    }[case]
    _, finished = step(a, {"r": first, "other": 11})
    r = a.request("r")
    if case in ("eos", "stop_token"):
        assert finished == {"r"} and r.finish_reason == "stop" and r.num_output_tokens == 1  # stop token kept
        assert [v.request_id for v in a.running()] == ["other"]
    else:
        assert finished == set() and r.status == "running"
    if case == "max_tokens":
        _, finished = step(a, {"r": 11})
        assert finished == {"r"} and a.request("r").finish_reason == "length" and a.request("r").num_output_tokens == 2
    if case == "ignore_eos":
        _, finished = step(a, {"r": EOS_TOKEN_ID})
        assert finished == set()
    if case == "min_tokens":  # the 2nd EOS is still under min_tokens=3; the 3rd ends it
        _, finished = step(a, {"r": EOS_TOKEN_ID})
        assert finished == set()
        _, finished = step(a, {"r": EOS_TOKEN_ID})
        assert finished == {"r"} and a.request("r").finish_reason == "stop"
