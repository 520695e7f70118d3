"""The SGLang adapter (conformance/adapters/sglang_adapter.py, SGLang 0.5.23's own scheduler), checked two ways:

- each way in which SGLang's scheduler departs from the suite's (vLLM's) rules, as sglang_rules.py declares it
  (`departures`, `known_differences`, `stalled`), and each design choice the issue names (prefill-or-decode steps, a
  budget over prefill only, one chunked request resuming first, admission that reserves KV for future output, the
  per-token radix cache), shown on its own small case: the reasons the run's summary prints are facts of SGLang
  0.5.23, and a release that changes one fails here, so that the declaration goes too;
- the adapter has teeth: the state machine, driven through it, catches a bug planted in SGLang's own code.

They need SGLang (`bash ci/setup_sglang_env.sh`, then `.venv-sglang/bin/pytest conformance/ --engine sglang`, which
runs them too); without it they skip.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

pytest.importorskip("sglang", reason="SGLang is not installed (bash ci/setup_sglang_env.sh builds .venv-sglang)")

from conformance.adapters.sglang_adapter import SGLangAdapter  # noqa: E402
from conformance.fake_runner import EOS_TOKEN_ID  # noqa: E402
from conformance.test_scheduler_examples import prompt, step  # noqa: E402
from conformance.test_scheduler_stateful import make_machine  # noqa: E402

pytestmark = pytest.mark.sglang  # also run by `pytest conformance/ --engine sglang`
MAX_STEPS = 20  # every case here ends well within this many steps; a loop that does not has stalled


def make(**knobs) -> SGLangAdapter:
    knobs.setdefault("enable_prefix_caching", False)
    return SGLangAdapter(eos_token_id=EOS_TOKEN_ID, **knobs)


def running_ids(a) -> list[str]:
    return [v.request_id for v in a.running()]


def waiting_ids(a) -> list[str]:
    return [v.request_id for v in a.waiting()]


# ---- the declared departures, each on its case ---------------------------------------------------------------------
def test_a_decode_step_runs_more_requests_than_the_budget():
    """`token_budget`: the budget covers prefill only; a decode step runs every running request."""
    a = make(batching="sequence", block_size=1, num_gpu_blocks=256, max_num_batched_tokens=4, max_num_seqs=6)
    for i in range(6):
        a.add_request(f"r{i}", prompt(2, 100 * i), max_tokens=20, ignore_eos=True)
    steps = [step(a)[0] for _ in range(6)]
    assert all(sum(s.num_scheduled_tokens.values()) <= 4 for s in steps[:3])  # three prefill steps of 2 + 2
    assert steps[3].num_scheduled_tokens == {f"r{i}": 1 for i in range(6)}  # 6 decodes > budget 4
    assert "token_budget" in SGLangAdapter.departures


@pytest.mark.parametrize("chunked", [False, True])
def test_a_prefill_step_leaves_the_running_requests_out(chunked):
    """`decode_first`: a step is prefill or decode; --enable-mixed-chunk (our `continuous`) takes the decodes along
    only with chunked prefill on."""
    a = make(
        batching="continuous",
        block_size=1,
        num_gpu_blocks=256,
        max_num_batched_tokens=16,
        enable_chunked_prefill=chunked,
    )
    a.add_request("r0", prompt(4), max_tokens=20, ignore_eos=True)
    step(a)
    step(a)  # r0 decoding
    a.add_request("r1", prompt(4, 2000), max_tokens=20, ignore_eos=True)
    out, _ = step(a)
    expected = {"r0": 1, "r1": 4} if chunked else {"r1": 4}
    assert out.num_scheduled_tokens == expected
    assert "decode_first" in SGLangAdapter.departures


def test_ignore_eos_ignores_stop_token_ids_too():
    """`finish` (1): with ignore_eos a stop token id does not stop the request (vLLM ignores only EOS)."""
    a = make(block_size=4, num_gpu_blocks=64)
    a.add_request("r", prompt(4), max_tokens=10, ignore_eos=True, stop_token_ids=[42])
    step(a)
    _, finished = step(a, {"r": 42})
    assert not finished and a.request("r").status == "running"
    assert "finish" in SGLangAdapter.departures


def test_max_new_tokens_is_clipped_to_the_empty_pool():
    """`finish` (2): 2 + 3 - 1 = 4 tokens fit a 4-block pool (vLLM's rule), but SGLang clips max_new_tokens to
    4 - 2 - 1 (one page) - 1 = 0: the request gets one token and ends 'length'."""
    a = make(block_size=1, num_gpu_blocks=4, max_num_batched_tokens=8)
    a.add_request("r", prompt(2), max_tokens=3, ignore_eos=True)
    finished: set[str] = set()
    for _ in range(MAX_STEPS):
        _, finished = step(a)
        if finished:
            break
    assert finished == {"r"}, a.running()
    assert a.request("r").num_output_tokens == 1 and a.request("r").finish_reason == "length"


def test_ignore_eos_requests_overrun_the_prefill_budget_without_chunking():
    """`prefill_budget`, SGLang's bug: without chunking, a second request is admitted only while its prompt is below
    the budget left, except on the ignore_eos path (radix cache off), which skips that cap."""
    for ignore_eos, expected in ((False, {"r1": 21}), (True, {"r1": 21, "r2": 36})):
        a = make(
            batching="sequence",
            block_size=8,
            num_gpu_blocks=33,
            max_num_batched_tokens=39,
            max_num_seqs=2,
            enable_chunked_prefill=False,
        )
        a.add_request("r1", prompt(21), max_tokens=3, ignore_eos=ignore_eos)
        a.add_request("r2", prompt(36, 2000), max_tokens=3, ignore_eos=ignore_eos)
        out, _ = step(a)
        assert out.num_scheduled_tokens == expected
    assert sum(expected.values()) > 39 and "prefill_budget" in SGLangAdapter.departures


def test_a_request_that_does_not_fit_sglangs_admission_stalls():
    """`stalled()`: a prompt that fills the pool fits vLLM's rule with max_tokens=1, but SGLang's admission reserves a
    page more; with the pool empty and nothing admitted, the adapter names the state instead of failing `progress`."""
    a = make(block_size=1, num_gpu_blocks=4, max_num_batched_tokens=8)
    a.add_request("r", prompt(4), max_tokens=1)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {} and a.stalled() is not None and "admission" in a.stalled()


def one_seat_priority_preempting(batching: str, *, max_num_batched_tokens: int) -> SGLangAdapter:
    """One running seat, 13 one-token blocks, priority scheduling with priority preemption."""
    return make(
        batching=batching,
        block_size=1,
        num_gpu_blocks=13,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=1,
        policy="priority",
        priority_preemption=True,
    )


def test_priority_preemption_in_a_prefill_or_decode_step():
    """`no_preemption_outside_continuous`: SGLang's default steps (our `sequence`) preempt too. r0 (priority 1) is
    decoding alone; r1 (priority 0, more urgent by more than the gap of 0) preempts it at admission, with 12 of 13
    blocks free."""
    a = one_seat_priority_preempting("sequence", max_num_batched_tokens=1)
    a.add_request("r0", prompt(1), max_tokens=10, priority=1, arrival_time=1)
    step(a)
    a.add_request("r1", prompt(1, 2000), max_tokens=10, priority=0, arrival_time=2)
    out, _ = step(a)
    assert out.preempted_req_ids == ["r0"] and out.num_scheduled_tokens == {"r1": 1}
    assert a.request("r0").status == "preempted"


def test_a_preempted_request_waits_behind_its_priority_peers():
    """`priority_arrival_order`: r0 (priority 1, arrival 1) is running, r2 (priority 1, arrival 3) waits for the one
    seat; r1 (priority 0) preempts r0, which re-enters SGLang's waiting queue behind r2, where vLLM's queue (by
    arrival time) would put it ahead."""
    a = one_seat_priority_preempting("continuous", max_num_batched_tokens=4)
    a.add_request("r0", prompt(1), max_tokens=10, priority=1, arrival_time=1)
    step(a)
    a.add_request("r2", prompt(1, 3000), max_tokens=10, priority=1, arrival_time=3)
    step(a)
    assert running_ids(a) == ["r0"] and waiting_ids(a) == ["r2"]
    a.add_request("r1", prompt(1, 2000), max_tokens=10, priority=0, arrival_time=2)
    out, _ = step(a)
    assert out.preempted_req_ids == ["r0"]
    assert waiting_ids(a) == ["r1", "r2", "r0"]  # vLLM: r1, r0, r2
    assert "priority_arrival_order" in SGLangAdapter.departures


def test_two_requests_cut_in_one_prefill_pass():
    """`stalled()`, SGLang's bug: page 2, budget 3. r0 (3 tokens) is cut to 2 by the page-rounded KV budget, which
    leaves 1 token of the budget, so r1 is cut too; only r1 stays the chunked request, and SGLang would sample a token
    for r0 after 2 of its 3 prompt tokens. The adapter names the state (the example ends there) instead of feeding it."""
    a = make(batching="continuous", block_size=2, num_gpu_blocks=13, max_num_batched_tokens=3, max_num_seqs=2)
    a.add_request("r0", prompt(3), max_tokens=1)
    a.add_request("r1", prompt(2, 2000), max_tokens=1, ignore_eos=True)
    out = a.schedule()
    assert out.num_scheduled_tokens == {"r0": 2, "r1": 1}
    assert a.sched.chunked_req is a._all["r1"] and a._all["r0"].inflight_middle_chunks == 0
    assert a.stalled() is not None and "two requests cut in one prefill pass" in a.stalled()


# ---- SGLang's design, as the issue names it -------------------------------------------------------------------------
def test_one_chunked_request_at_a_time_and_it_resumes_first():
    a = make(block_size=1, num_gpu_blocks=256, max_num_batched_tokens=8, batching="sequence")
    a.add_request("r0", prompt(12), max_tokens=2)
    a.add_request("r1", prompt(20, 2000), max_tokens=2)
    first, _ = step(a)
    second, _ = step(a)
    third, _ = step(a)
    assert first.num_scheduled_tokens == {"r0": 8}
    assert second.num_scheduled_tokens == {"r0": 4, "r1": 4}  # r0 resumes first, r1 becomes the chunked one
    assert third.num_scheduled_tokens == {"r1": 8}


def test_admission_reserves_kv_for_future_output():
    """FCFS stops at the first request that does not fit with its future output reserved (prompt + a ratio of
    max_new_tokens): b waits although its 3 prompt tokens fit the 6 free blocks many times over."""
    a = make(block_size=1, num_gpu_blocks=16, max_num_batched_tokens=16, batching="sequence")
    a.add_request("a", prompt(1), max_tokens=10)
    a.add_request("b", prompt(3, 2000), max_tokens=10)
    a.add_request("c", prompt(1, 3000), max_tokens=10)
    for _ in range(10):
        step(a)
        assert running_ids(a) == ["a"] or a.request("a").status == "finished"
    assert waiting_ids(a)[0] == "b" and a.num_free_blocks() >= 6
    out, _ = step(a)
    assert out.new_req_ids == ["b"]


def test_the_radix_cache_shares_a_chunk_from_the_next_step():
    """Per-token radix cache: the first chunk of an unfinished request is in the tree by the next step, so a request
    with the same prefix arriving then starts from it."""
    a = make(
        block_size=1, num_gpu_blocks=256, max_num_batched_tokens=8, enable_prefix_caching=True, batching="sequence"
    )
    a.add_request("r0", prompt(12), max_tokens=4)
    step(a)  # r0's first 8 tokens
    a.add_request("r1", prompt(10), max_tokens=4)
    out, _ = step(a)
    assert out.num_scheduled_tokens["r0"] == 4
    v = a.request("r1")
    assert v.num_computed_tokens - out.num_scheduled_tokens["r1"] == 8  # r0's first chunk, shared
    assert a.request("r1").block_ids[:8] == a.request("r0").block_ids[:8]


# ---- the adapter has teeth ----------------------------------------------------------------------------------------------
def test_state_machine_catches_a_kv_leak_planted_in_sglang(monkeypatch):
    """A finished request's KV is never released (SGLang's release_kv_cache, as the result processor calls it, made a
    no-op): the state machine through the adapter fails on block accounting or leaks."""
    from sglang.srt.managers.scheduler_components import batch_result_processor

    monkeypatch.setattr(batch_result_processor, "release_kv_cache", lambda *args, **kwargs: None)
    machine = make_machine(SGLangAdapter, ("continuous",))
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=30, phases=[Phase.generate], deadline=None, suppress_health_check=list(HealthCheck)
            ),
        )
    assert re.search(r"invariant `(block_accounting|no_leaks|blocks_per_request)` violated", str(info.value)), str(
        info.value
    )
