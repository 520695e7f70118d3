"""The transformers adapter (conformance/adapters/transformers_adapter.py), checked two ways:

- each way in which transformers' continuous batching departs from the suite's (vLLM's) rules, as the adapter
  declares it (`departures`, `known_differences`, `stalled`), shown on its own small case next to refengine's
  answer to the same case: the reasons the run's summary prints are facts of transformers 5.25, and a transformers
  release that changes one fails here, so that the declaration goes too;
- the adapter has teeth: the state machine, driven through it, catches bugs planted in transformers' own scheduler,
  departures notwithstanding.

These run in the default suite (transformers is a cbbench dependency); `pytest conformance/ --engine transformers`
runs the whole engine-agnostic suite through the adapter.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

pytest.importorskip("transformers.generation.continuous_batching", reason="transformers without continuous batching")

from transformers.generation.continuous_batching import scheduler as tf_scheduler  # noqa: E402

from conformance.adapters.refengine_adapter import RefEngineAdapter  # noqa: E402
from conformance.adapters.transformers_adapter import TransformersAdapter  # noqa: E402
from conformance.fake_runner import EOS_TOKEN_ID  # noqa: E402
from conformance.progress import guarded  # noqa: E402
from conformance.test_scheduler_examples import prompt, step  # noqa: E402
from conformance.test_scheduler_stateful import make_machine  # noqa: E402

pytestmark = pytest.mark.transformers  # also run by `pytest conformance/ --engine transformers`

ENGINES = [RefEngineAdapter, TransformersAdapter]


def make(adapter_cls, **knobs):
    knobs.setdefault("enable_prefix_caching", False)
    return guarded(adapter_cls)(eos_token_id=EOS_TOKEN_ID, **knobs)  # a stuck engine fails with its state


def running_ids(a) -> list[str]:
    return [v.request_id for v in a.running()]


def waiting_ids(a) -> list[str]:
    return [v.request_id for v in a.waiting()]


# ---- the declared departures, each on its case ---------------------------------------------------------------------
@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_victim_is_the_starved_request(adapter_cls):
    """`preemption_victim`: r0 (admitted first) needs a 3rd block, r1 does not. refengine (as vLLM) preempts r1, the
    most recently admitted, so that r0 gets its block; transformers schedules r1 and offloads r0, the starved one."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=4, max_num_batched_tokens=64, max_num_seqs=8)
    a.add_request("r0", prompt(8), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    step(a)  # r0: 8 tokens in 2 full blocks; r1: 6 tokens in 2 blocks
    out, _ = step(a)
    expected = {"refengine": ({"r0": 1}, ["r1"]), "transformers": ({"r1": 1}, ["r0"])}[adapter_cls.name]
    assert (out.num_scheduled_tokens, out.preempted_req_ids) == expected
    assert "preemption_victim" in TransformersAdapter.departures


@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_a_waiting_request_that_does_not_fit_is_skipped(adapter_cls):
    """`admission_order`: w1 (3 blocks) does not fit the 2 free blocks. refengine (as vLLM) stops admitting there, so
    w2 waits behind it; transformers skips w1 and admits w2."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=4, max_num_batched_tokens=64, max_num_seqs=8)
    a.add_request("r", prompt(6), max_tokens=10, arrival_time=0)
    step(a)
    a.add_request("w1", prompt(9, 2000), max_tokens=1, arrival_time=1)
    a.add_request("w2", prompt(3, 3000), max_tokens=1, arrival_time=2)
    out, _ = step(a)
    expected = {"refengine": ({"r": 1}, ["w1", "w2"]), "transformers": ({"r": 1, "w2": 3}, ["w1"])}[adapter_cls.name]
    assert (out.num_scheduled_tokens, waiting_ids(a)) == expected
    assert "admission_order" in TransformersAdapter.departures


def _short_of_blocks(adapter_cls, num_gpu_blocks: int, prefix_len: int):
    """p finishes, its full prefix blocks kept cached; r's first chunk takes 2 blocks; then r's second chunk needs 2
    blocks while 1 is free, and w (1 block) waits. Returns the adapter and the step that decides."""
    a = make(
        adapter_cls,
        block_size=4,
        num_gpu_blocks=num_gpu_blocks,
        max_num_batched_tokens=8,
        max_num_seqs=1,
        enable_prefix_caching=True,
    )
    a.add_request("p", prompt(prefix_len, 5000), max_tokens=2, arrival_time=0)
    step(a)
    step(a)  # p finished: its full blocks stay cached
    a.add_request("r", prompt(16), max_tokens=10, arrival_time=1)
    step(a)
    a.add_request("w", prompt(2, 3000), max_tokens=10, arrival_time=2)
    out, _ = step(a)
    return a, out


@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_a_running_request_short_of_blocks_lets_a_waiting_one_in(adapter_cls):
    """`decode_first` and `max_num_seqs`: 2 blocks cached, 1 free. refengine (as vLLM) reclaims cached blocks for r
    and admits nothing more (max_num_seqs=1); transformers reclaims cached blocks only after a step in which a
    request starved, so r is skipped and w admitted, and after the step both hold blocks: 2 running."""
    a, out = _short_of_blocks(adapter_cls, num_gpu_blocks=5, prefix_len=8)
    expected = {"refengine": ({"r": 8}, ["r"]), "transformers": ({"w": 2}, ["r", "w"])}[adapter_cls.name]
    assert (out.num_scheduled_tokens, running_ids(a)) == expected
    assert {"decode_first", "max_num_seqs"} <= set(TransformersAdapter.departures)


@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_one_step_admits_and_preempts(adapter_cls):
    """`no_admission_after_preemption` (and `preemption_victim`): 1 block cached, 1 free. refengine (as vLLM)
    reclaims the cached block for r; transformers admits w into the free block, and after the step, with the cached
    block reclaimed and r still 1 short, offloads r: one step admits and preempts."""
    a, out = _short_of_blocks(adapter_cls, num_gpu_blocks=4, prefix_len=4)
    expected = {"refengine": ({"r": 8}, []), "transformers": ({"w": 2}, ["r"])}[adapter_cls.name]
    assert (out.num_scheduled_tokens, out.preempted_req_ids) == expected
    assert "no_admission_after_preemption" in TransformersAdapter.departures


# ---- the known differences of the named examples, and the known stall ----------------------------------------------
@pytest.mark.parametrize("max_tokens, hit", [(1, False), (2, True)], ids=["finishes-at-prefill", "decodes-once"])
def test_blocks_completed_by_a_finishing_step_are_not_cached(max_tokens, hit):
    """`blocks_of_a_finishing_step_cached`: a's two full blocks are hashed for prefix sharing only when a does not
    finish in the step that completed them; b (same prompt) then hits one block (the last token is always
    recomputed) or none."""
    a = make(TransformersAdapter, block_size=4, num_gpu_blocks=16, enable_prefix_caching=True)
    a.add_request("a", prompt(8), max_tokens=max_tokens, arrival_time=0)
    while a.request("a").status != "finished":
        step(a)
    a.add_request("b", prompt(8), max_tokens=1, arrival_time=1)
    out, _ = step(a)
    assert out.num_scheduled_tokens == {"b": 4 if hit else 8}
    assert "blocks_of_a_finishing_step_cached" in TransformersAdapter.known_differences


@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_cached_blocks_are_reclaimed_all_at_once(adapter_cls):
    """`lru_eviction`: the LRU example with a and b decoding once (so that transformers caches their blocks). c needs
    5 blocks, 4 are free: refengine (as vLLM) evicts a's blocks (freed first) and keeps b's, so b2 hits both;
    transformers evicts every cached block, so b2 hits none."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=8, enable_prefix_caching=True)
    for rid, start, t in [("a", 1000, 0), ("b", 2000, 1)]:
        a.add_request(rid, prompt(8, start), max_tokens=2, arrival_time=t)
        step(a)
        step(a)
    a.add_request("c", prompt(17, 3000), max_tokens=10, arrival_time=2)
    step(a)
    a.add_request("b2", prompt(9, 2000), max_tokens=1, arrival_time=3)
    out, _ = step(a)
    assert out.num_scheduled_tokens["b2"] == {"refengine": 1, "transformers": 9}[adapter_cls.name]
    assert "lru_eviction" in TransformersAdapter.known_differences


@pytest.mark.parametrize("adapter_cls", ENGINES, ids=lambda c: c.name)
def test_abort_after_an_offload(adapter_cls):
    """`stalled`: r0 is offloaded (the victim case above), then r1, the only running request, is aborted.
    refengine resumes r0; transformers admits nothing until a request finishes in update_batch, and none is left
    to: r0 waits for ever, which the adapter names."""
    a = make(adapter_cls, block_size=4, num_gpu_blocks=4, max_num_batched_tokens=64, max_num_seqs=8)
    a.add_request("r0", prompt(8), max_tokens=8, arrival_time=0)
    a.add_request("r1", prompt(6, 2000), max_tokens=8, arrival_time=1)
    step(a)
    out, _ = step(a)
    victim = out.preempted_req_ids[0]
    survivor = "r1" if victim == "r0" else "r0"
    held = a.request(victim).num_tokens  # its prompt and the tokens it generated before it was preempted
    a.abort([survivor])
    scheduled = [step(a)[0].num_scheduled_tokens for _ in range(3)]
    if adapter_cls is TransformersAdapter:
        assert scheduled == [{}, {}, {}] and waiting_ids(a) == [victim]
        assert a.stalled() is not None and "block_new_requests" in a.stalled()
    else:
        assert scheduled[0] == {victim: held}  # re-prefilled, its generated tokens with it


def test_cpu_swap_pool_crash():
    """`stalled` (a crash): a 1-block CPU pool. r1 is offloaded to it and restored, which leaves its block free in
    the pool; then r2, holding 2 blocks, is the victim: instead of falling back to a soft reset, transformers'
    _reserve_cpu_blocks raises ValueError, which in its generation loop fails every request."""
    a = make(
        TransformersAdapter,
        block_size=4,
        num_gpu_blocks=4,
        num_cpu_blocks=1,
        max_num_batched_tokens=4,
        max_num_seqs=3,
        preemption_mode="swap",
    )
    for i, p in enumerate([[1001], [1002], [1003, 1004]]):
        a.add_request(f"r{i}", p, max_tokens=8, arrival_time=i)
    swapped_in = []
    for _ in range(12):
        out, _ = step(a)
        swapped_in += out.blocks_to_swap_in
        if a.stalled():
            break
    assert swapped_in == [(0, 2)]  # r1 came back from the pool's only block
    assert a.stalled() is not None and "Cannot pop 2 leaves" in a.stalled()
    with pytest.raises(RuntimeError, match="crashed in an earlier step"):
        a.schedule()


# ---- the adapter has teeth: bugs planted in transformers' own scheduler --------------------------------------------
class LoseStarvedScheduler(tf_scheduler.FIFOScheduler):
    """A planted bug: a running request that could not get its blocks is dropped (its blocks freed) instead of being
    left for the offloading to requeue."""

    def schedule_batch(self, token_budget, cache_budget):
        out = super().schedule_batch(token_budget, cache_budget)
        for state, _ in self.starved_requests:
            self.finish_request(state.request_id)
        self.starved_requests = []
        return out


class LeakOnFinishScheduler(tf_scheduler.FIFOScheduler):
    """A planted bug: a finished request's last block is never given back to the pool."""

    def finish_request(self, request_id):
        for allocator in self.cache.cache_allocators.values():
            table = allocator.block_table.get(request_id)
            if table:
                table.pop()
        super().finish_request(request_id)


BITES = {LoseStarvedScheduler: "token_accounting", LeakOnFinishScheduler: "block_accounting|no_leaks"}


@pytest.mark.parametrize("scheduler_cls", list(BITES), ids=lambda c: c.__name__)
def test_state_machine_catches_a_bug_planted_in_transformers(monkeypatch, scheduler_cls):
    name = f"planted_{scheduler_cls.__name__}"
    monkeypatch.setitem(tf_scheduler.SCHEDULER_MAPPING, name, scheduler_cls)
    adapter = type(f"{scheduler_cls.__name__}Adapter", (TransformersAdapter,), {"scheduler_type": name})
    assert isinstance(adapter(eos_token_id=EOS_TOKEN_ID).sched, scheduler_cls)  # transformers took it, no fallback
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(
            make_machine(adapter, ("continuous",)),
            settings=settings(
                max_examples=100,
                derandomize=True,
                database=None,
                phases=[Phase.generate, Phase.target],
                report_multiple_bugs=False,
                deadline=None,
                print_blob=False,
                suppress_health_check=list(HealthCheck),
            ),
        )
    assert re.search(rf"invariant `({BITES[scheduler_cls]})` violated", str(info.value)), str(info.value)
