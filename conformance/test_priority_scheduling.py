"""Priority scheduling, the rules of docs/scheduling.md one at a time: the waiting queue orders by (priority, arrival
time), ties by arrival whatever the order requests were added or admitted in; the KV-pressure victim is the largest
(priority, arrival time); with priority_preemption (beyond vLLM) a waiting request preempts a running one only when
it is strictly more urgent, so requests of equal priority never take turns evicting each other (a livelock: each
re-prefill thrown away before it samples); and a preempted request still finishes, with every output it had.

Every loop here runs under the progress guard (conformance/progress.py, through the `adapter_cls` fixture): a
scheduler that stops making progress fails with its state instead of hanging the run."""

from __future__ import annotations

from conformance.adapters import expect_known_difference
from conformance.test_scheduler_examples import make, prompt, step


def _drain(a, rids) -> None:
    while not all(a.request(r).status == "finished" for r in rids):
        step(a)  # (the progress guard fails a stuck engine here)


def test_waiting_order_ties_by_arrival_not_by_the_order_requests_were_added(request, adapter_cls):
    """Equal priority: admitted by arrival time, although added latest-first and with ids in the other order."""
    expect_known_difference(request, adapter_cls, "priority_ties_by_queue_entry")
    a = make(adapter_cls, policy="priority", max_num_seqs=1, block_size=4, num_gpu_blocks=16)
    for rid, t in (("a", 3), ("b", 2), ("c", 1)):
        a.add_request(rid, prompt(4, 1000 * t), max_tokens=1, priority=2, arrival_time=t)
    admitted = []
    while len(admitted) < 3:
        out, _ = step(a)
        admitted += out.new_req_ids
    assert admitted == ["c", "b", "a"]


def test_the_kv_victim_among_equal_priorities_is_the_latest_arrival_not_the_last_admitted(request, adapter_cls):
    """`late` (arrival 5) is admitted before `early` (arrival 1) because it came to the queue first. When a block
    runs out, the victim is the largest (priority, arrival time): `late`, although `early` was admitted last (the
    FCFS victim)."""
    expect_known_difference(request, adapter_cls, "admission_reserves_future_output")
    a = make(adapter_cls, policy="priority", block_size=4, num_gpu_blocks=4, max_num_batched_tokens=64)
    a.add_request("late", prompt(6, 1000), max_tokens=8, priority=1, arrival_time=5)
    step(a)
    a.add_request("early", prompt(6, 2000), max_tokens=8, priority=1, arrival_time=1)
    out, _ = step(a)
    assert out.new_req_ids == ["early"]
    while not out.preempted_req_ids:
        out, _ = step(a)
    assert out.preempted_req_ids == ["late"]
    _drain(a, ["late", "early"])
    assert [a.request(r).num_output_tokens for r in ("late", "early")] == [8, 8]


def test_priority_preemption_never_preempts_an_equally_urgent_request(adapter_cls):
    """One seat (max_num_seqs=1), then one block short: W, as urgent as running R, waits for R to finish; it never
    preempts R to get in. Neither is ever preempted."""
    for knobs in (dict(max_num_seqs=1, num_gpu_blocks=16), dict(max_num_seqs=4, num_gpu_blocks=3)):
        a = make(
            adapter_cls, policy="priority", priority_preemption=True, block_size=4, max_num_batched_tokens=64, **knobs
        )
        a.add_request("R", prompt(6, 1000), max_tokens=3, priority=1, arrival_time=0)
        step(a)
        a.add_request("W", prompt(6, 2000), max_tokens=3, priority=1, arrival_time=1)
        while a.request("R").status != "finished":
            out, _ = step(a)
            assert out.preempted_req_ids == [] and out.new_req_ids == [], (knobs, out)
        _drain(a, ["W"])
        assert [a.request(r).num_preemptions for r in "RW"] == [0, 0], knobs


def test_priority_preemption_takes_the_least_urgent_and_only_a_strictly_less_urgent_one(adapter_cls):
    """Two seats: L (priority 3) and M (priority 1) run. X (priority 1) preempts L, the least urgent, not M, its
    equal; then Y (priority 1) finds only equals running (M, X) and waits."""
    a = make(
        adapter_cls,
        policy="priority",
        priority_preemption=True,
        max_num_seqs=2,
        block_size=4,
        num_gpu_blocks=32,
        max_num_batched_tokens=64,
    )
    a.add_request("L", prompt(6, 1000), max_tokens=6, priority=3, arrival_time=0)
    a.add_request("M", prompt(6, 2000), max_tokens=6, priority=1, arrival_time=1)
    step(a)
    a.add_request("X", prompt(6, 3000), max_tokens=6, priority=1, arrival_time=2)
    out, _ = step(a)
    assert out.preempted_req_ids == ["L"] and out.new_req_ids == ["X"]
    a.add_request("Y", prompt(6, 4000), max_tokens=6, priority=1, arrival_time=3)
    out, _ = step(a)
    assert out.preempted_req_ids == [] and out.new_req_ids == []
    _drain(a, "LMXY")
    assert [a.request(r).num_output_tokens for r in "LMXY"] == [6] * 4
    assert [a.request(r).num_preemptions for r in "LMXY"] == [1, 0, 0, 0]


def test_equally_urgent_requests_under_priority_preemption_all_finish(adapter_cls):
    """Four requests of one priority, prompts prefilled in chunks over several steps, bound by seats (one) or by
    blocks (a pool of about two requests): KV pressure may preempt (the latest arrival), admission never does. Were a
    waiting request allowed to preempt an equal, each re-prefill would be thrown away before it samples: a
    livelock, which the progress guard turns into a failure that shows the requests taking turns."""
    for knobs in (dict(max_num_seqs=1, num_gpu_blocks=32), dict(max_num_seqs=4, num_gpu_blocks=7)):
        a = make(
            adapter_cls, policy="priority", priority_preemption=True, block_size=4, max_num_batched_tokens=4, **knobs
        )
        for i in range(4):
            a.add_request(f"r{i}", prompt(10, 1000 * (i + 1)), max_tokens=6, priority=2, arrival_time=i)
        _drain(a, [f"r{i}" for i in range(4)])
        assert [a.request(f"r{i}").num_output_tokens for i in range(4)] == [6] * 4, knobs


def test_a_request_preempted_again_and_again_still_finishes_with_all_its_outputs(adapter_cls):
    """L (priority 5) runs; urgent requests keep arriving, each preempting it (recompute). Once they stop, L
    finishes with every output it had generated kept and max_tokens outputs in all."""
    a = make(
        adapter_cls,
        policy="priority",
        priority_preemption=True,
        max_num_seqs=1,
        block_size=4,
        num_gpu_blocks=16,
        max_num_batched_tokens=64,
    )
    a.add_request("L", prompt(6, 1000), max_tokens=12, priority=5, arrival_time=0)
    preempted = 0
    for i in range(4):
        step(a)
        step(a)  # L decodes a token or two between arrivals
        kept = a.request("L").num_output_tokens
        a.add_request(f"u{i}", prompt(4, 2000 + 100 * i), max_tokens=2, priority=0, arrival_time=1 + i)
        out, _ = step(a)
        preempted += out.preempted_req_ids == ["L"]
        assert a.request("L").num_output_tokens >= kept  # generated tokens survive the recompute preemption
    _drain(a, ["L"] + [f"u{i}" for i in range(4)])
    assert preempted == 4 and a.request("L").num_preemptions == 4
    assert (a.request("L").num_output_tokens, a.request("L").finish_reason) == (12, "length")
