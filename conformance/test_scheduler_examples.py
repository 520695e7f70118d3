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


def test_recompute_keeps_generated_tokens_and_reprefills_them(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "admission_reserves_future_output")
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
    assert out.new_req_ids == ["r1"]  # a resumed request is admitted from waiting again, as a new one is
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


def test_swap_fills_the_host_pool_exactly_then_the_next_victim_recomputes(adapter_cls):
    """A victim whose blocks exactly fill the host pool is swapped out (fits exactly is fits); with the pool then
    full, the next victim falls back to recompute; the swapped one comes back from the same host blocks, which are
    free again once that step is scheduled."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=6, num_cpu_blocks=2, preemption_mode="swap")
    for i in range(3):
        a.add_request(f"r{i}", prompt(6, 1000 * (i + 1)), max_tokens=10, arrival_time=i)
    for _ in range(3):
        step(a)  # three 6-token prompts, two blocks each, then two decodes: 8 tokens, every block full
    held = a.request("r2").block_ids
    out, _ = step(a)  # r0 and r1 each need a third block: r2, the last admitted, gives way
    assert out.preempted_req_ids == ["r2"] and len(held) == 2
    assert [d for d, _ in out.blocks_to_swap_out] == held, "2 blocks for 2 free host blocks: a swap, not a recompute"
    host = [h for _, h in out.blocks_to_swap_out]
    assert a.request("r2").host_block_ids == host and a.request("r2").num_computed_tokens == 8
    while not out.preempted_req_ids or out.preempted_req_ids == ["r2"]:
        out, _ = step(a)
    assert out.preempted_req_ids == ["r1"] and out.blocks_to_swap_out == []  # the host pool is full: recompute
    assert a.request("r1").num_computed_tokens == 0 and a.request("r2").host_block_ids == host
    while not out.blocks_to_swap_in:
        out, _ = step(a)
    assert [h for h, _ in out.blocks_to_swap_in] == host and out.num_scheduled_tokens == {"r2": 1}
    if hasattr(a, "host_block_ref_counts"):
        assert not any(a.host_block_ref_counts().values())  # the swap-in's sources are free once it is scheduled
    while any(a.request(f"r{i}").status != "finished" for i in range(3)):  # (which of r1, r2 ends first is the
        step(a)  # engine's: transformers readmits the recomputed r1 only after the swapped r2 has finished)
    assert [a.request(f"r{i}").num_output_tokens for i in range(3)] == [10, 10, 10]


# ---- async scheduling: a step's output comes back after the next step is scheduled ---------------------------------
class AsyncDriver:
    """Drives an adapter as vLLM's engine core drives its AsyncScheduler: each tick schedules step N+1, then feeds
    step N's samples. A step samples for the requests whose known and in-flight tokens are all computed, the token of
    output position `sample_index`; each must be delivered as exactly that output (a request preempted meanwhile
    still gets it; one that finished meanwhile drops it)."""

    def __init__(self, a) -> None:
        self.a = a
        self.pending: dict[str, int] | None = None  # the last step's {request: output position sampled}
        self.delivered: dict[str, int] = {}  # request -> outputs delivered so far

    def tick(self):
        a = self.a
        out = a.schedule()
        now = {rid: a.request(rid).sample_index for rid in out.num_scheduled_tokens if a.request(rid).samples_now()}
        fed, self.pending = self.pending, now
        finished: set[str] = set()
        if fed is not None:
            for rid, index in fed.items():
                if a.request(rid).status == "finished":
                    continue  # finished since that step was scheduled: its token is dropped
                n = self.delivered.get(rid, 0)
                assert index == n, f"{rid}: the token sampled for output {index} is delivered as output {n}"
                self.delivered[rid] = n + 1
            finished = set(a.update({rid: [TOK] for rid in fed}))
        return out, finished


def test_async_a_token_in_flight_reaches_its_preempted_request_before_it_is_readmitted(adapter_cls):
    """vLLM's AsyncScheduler: a request preempted by recompute while its step's token is in flight gets that token
    when the step's output comes back, and its re-prefill, later, covers it: no output position is sampled twice or
    skipped (AsyncDriver checks each delivery), and it ends with exactly max_tokens outputs."""
    a = make(
        adapter_cls, block_size=4, num_gpu_blocks=4, max_num_batched_tokens=64, max_num_seqs=4, async_scheduling=True
    )
    a.add_request("r0", prompt(6), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    d = AsyncDriver(a)
    in_flight = None
    for _ in range(40):
        sampling = dict(d.pending or {})
        out, _ = d.tick()
        r1 = a.request("r1")
        if in_flight is None and "r1" in out.preempted_req_ids:
            # r0's third block preempts r1 (the last admitted) while r1's output #in_flight is in flight; this tick
            # fed that output: r1 holds it, waiting, with nothing computed
            assert "r1" in sampling, "meant to preempt r1 while its token is in flight"
            in_flight = sampling["r1"]
            assert (r1.status, r1.num_output_tokens, r1.num_computed_tokens) == ("preempted", in_flight + 1, 0)
        elif in_flight is not None and "r1" in out.new_req_ids:
            # readmitted: it re-prefills its prompt and every output, the one that was in flight included
            assert r1.num_output_tokens == in_flight + 1
            assert out.num_scheduled_tokens["r1"] == 6 + in_flight + 1 == r1.num_computed_tokens
        if all(a.request(r).status == "finished" for r in ("r0", "r1")):
            break
    assert in_flight is not None, "the pool was sized to preempt r1"
    for rid in ("r0", "r1"):
        v = a.request(rid)
        assert (v.finish_reason, v.num_output_tokens, d.delivered[rid]) == ("length", 8, 8), v


def test_async_a_victim_with_its_token_in_flight_is_not_readmitted_in_the_same_step(adapter_cls):
    """priority_preemption (beyond vLLM): urgent X preempts V to get in, and V's freed blocks would let V back at
    once (a prefix hit on two of them, one block to spare). But V's token is in flight: readmitted now, V would
    re-prefill without it and sample that output position again. V waits until the token is back, passed over
    without blocking the queue: W, less urgent, still gets in."""
    a = make(
        adapter_cls,
        block_size=4,
        num_gpu_blocks=4,
        max_num_batched_tokens=64,
        async_scheduling=True,
        enable_prefix_caching=True,
        policy="priority",
        priority_preemption=True,
    )
    a.add_request("V", prompt(11), max_tokens=6, priority=5, arrival_time=0)
    d = AsyncDriver(a)
    d.tick()  # V's prompt (3 blocks); its output #0 in flight
    d.tick()  # V decodes: all 12 known tokens computed, output #1 in flight
    a.add_request("X", prompt(4, 3000), max_tokens=3, priority=0, arrival_time=1)
    a.add_request("W", prompt(4, 4000), max_tokens=3, priority=6, arrival_time=2)
    sampling = dict(d.pending or {})
    out, _ = d.tick()  # no block for X: it preempts V, the less urgent; X and W each take one of V's 4 freed blocks
    assert sampling == {"V": 1} and out.preempted_req_ids == ["V"]
    assert out.num_scheduled_tokens == {"X": 4, "W": 4}, "V readmitted with its token in flight, or W held back"
    v = a.request("V")
    assert (v.status, v.num_output_tokens) == ("preempted", 2)  # output #1 came back to it in this tick
    while not all(a.request(r).status == "finished" for r in "VXW"):
        d.tick()
    assert [(a.request(r).num_output_tokens, d.delivered[r]) for r in "VXW"] == [(6, 6), (3, 3), (3, 3)]


def test_async_a_swap_out_never_lands_in_the_host_blocks_a_swap_in_of_the_same_step_reads(adapter_cls):
    """The runner copies a step's swap-outs before its swap-ins, so a host block that a swap-in reads from must not
    take a swap-out of the same step (its KV would be overwritten before it is read back). Reachable with
    priority_preemption under async scheduling: V, preempted with its token in flight, is passed over while less
    urgent C gets in; in the next step V is swapped back in, then urgent X preempts C, whose KV is swapped out."""
    a = make(
        adapter_cls,
        block_size=4,
        num_gpu_blocks=12,
        num_cpu_blocks=8,
        max_num_batched_tokens=64,
        async_scheduling=True,
        policy="priority",
        priority_preemption=True,
        preemption_mode="swap",
    )
    a.add_request("V", prompt(8, 1000), max_tokens=6, priority=5, arrival_time=0)
    a.add_request("P", prompt(16, 6000), max_tokens=2, priority=1, arrival_time=1)
    d = AsyncDriver(a)
    d.tick()
    d.tick()  # V holds 3 blocks, P 5; both have a token in flight, P its last
    a.add_request("Y", prompt(18, 2000), max_tokens=3, priority=0, arrival_time=2)
    a.add_request("C", prompt(1, 4000), max_tokens=6, priority=9, arrival_time=3)
    out, _ = d.tick()  # Y (5 blocks) preempts V (swapped out); V's token is in flight: C gets in instead; P ends
    assert out.preempted_req_ids == ["V"] and len(out.blocks_to_swap_out) == 3
    assert out.num_scheduled_tokens == {"Y": 18, "C": 1}
    a.add_request("X", prompt(14, 5000), max_tokens=3, priority=6, arrival_time=4)
    out, _ = d.tick()  # V is swapped back in (P's blocks are free); X (4 blocks) preempts C, swapped out
    assert out.preempted_req_ids == ["C"] and {"V", "X"} <= set(out.num_scheduled_tokens)
    read = {h for h, _ in out.blocks_to_swap_in}
    written = {h for _, h in out.blocks_to_swap_out}
    assert len(read) == 3 and len(written) == 1
    assert not read & written, f"host blocks {sorted(read & written)} are written before they are read back"
    while not all(a.request(r).status == "finished" for r in "VPYCX"):
        d.tick()
    assert [d.delivered[r] for r in "VPYCX"] == [6, 2, 3, 6, 3]


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


def test_a_readmission_keeps_the_prefix_hit_of_the_first_admission(request, adapter_cls):
    """vLLM's num_cached_tokens (its usage's cached_tokens, its metrics) is the prefix-cache hit of a request's first
    admission. Readmitted after a recompute preemption, the request hits more (its own freed blocks): that larger
    hit saves the re-prefill, and leaves num_cached_tokens as it was."""
    # P ends at its prefill
    expect_known_difference(
        request, adapter_cls, "blocks_of_a_finishing_step_cached", "admission_reserves_future_output"
    )
    a = make(
        adapter_cls,
        block_size=4,
        num_gpu_blocks=5,
        max_num_batched_tokens=64,
        max_num_seqs=4,
        enable_prefix_caching=True,
    )
    a.add_request("P", prompt(8), max_tokens=1, arrival_time=0)
    step(a)  # P's two full blocks stay cached once it has finished
    a.add_request("B", prompt(6, 2000), max_tokens=2, arrival_time=1)
    a.add_request("A", prompt(8) + prompt(4, 5000), max_tokens=8, arrival_time=2)
    out, _ = step(a)  # B takes 2 blocks; A hits P's 2 and takes 1 for its last 4 prompt tokens: no block is left
    assert out.num_scheduled_tokens == {"B": 6, "A": 4}
    if a.request("A").num_cached_tokens is not None:
        assert a.request("A").num_cached_tokens == 8
    out, finished = step(a)  # A's 13th token needs a 4th block: A, the last admitted, preempts itself; B finishes
    assert out.preempted_req_ids == ["A"] and finished == {"B"}
    out, _ = step(a)  # A's three full blocks (12 tokens) are still cached: only its 13th token is computed
    assert out.num_scheduled_tokens == {"A": 1} and a.request("A").num_computed_tokens == 13
    if a.request("A").num_cached_tokens is not None:
        assert a.request("A").num_cached_tokens == 8, "the readmission's hit replaced the first admission's"
    while a.request("A").status != "finished":
        step(a)
    if a.request("A").num_cached_tokens is not None:
        assert a.request("A").num_cached_tokens == 8


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
    expect_known_difference(
        request, adapter_cls, "blocks_of_a_finishing_step_cached", "lru_eviction", "admission_reserves_future_output"
    )
    a = _lru_setup(adapter_cls)
    a.add_request("A2", prompt(9, 1000), max_tokens=1, arrival_time=3)
    out, _ = step(a)
    assert out.num_scheduled_tokens["A2"] == 9 - 4  # A1 was evicted by C, A0 (freed last of A's) is still cached


def test_lru_keeps_the_most_recently_freed_blocks(request, adapter_cls):
    expect_known_difference(
        request, adapter_cls, "blocks_of_a_finishing_step_cached", "lru_eviction", "admission_reserves_future_output"
    )
    a = _lru_setup(adapter_cls)
    a.add_request("B2", prompt(9, 2000), max_tokens=1, arrival_time=3)
    out, _ = step(a)
    assert out.num_scheduled_tokens["B2"] == 1  # B, freed after A, kept both full blocks


# ---- policies and modes -------------------------------------------------------------------------------------------
def test_priority_preempts_the_largest_priority_arrival(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "admission_reserves_future_output")
    a = make(adapter_cls, block_size=4, num_gpu_blocks=6, policy="priority")
    for rid, prio, t in [("r0", 0, 0), ("r1", 2, 1), ("r2", 1, 2)]:
        a.add_request(rid, prompt(6, 1000 * (t + 1)), max_tokens=8, priority=prio, arrival_time=t)
    for _ in range(3):
        step(a)
    out, _ = step(a)  # r0 needs a 3rd block: the victim is r1 (priority 2), not r2, the most recently admitted
    assert out.preempted_req_ids == ["r1"]
    assert [v.request_id for v in a.running()] == ["r0", "r2"]


def test_chunked_prefill_off_stops_admission_at_head_of_line(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "prefill_or_decode_steps")
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


def test_vllm_style_preempt_when_kv_is_full(request, adapter_cls):
    expect_known_difference(request, adapter_cls, "admission_reserves_future_output")
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
