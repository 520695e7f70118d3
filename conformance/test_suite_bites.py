"""The suite bites: each test plants one bug in a Scheduler subclass, runs the same state machine as
test_scheduler_stateful.py against it, and expects Hypothesis to find a failure of the named invariant that guards
that rule. Derandomized (a fixed search, so the result is the same on every machine) and without shrinking (the
shrunk examples are recorded in the README); to see one shrunk, run with BITES_SHRINK=1.
"""

from __future__ import annotations

import os
import re

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from conformance.adapters.refengine_adapter import RefEngineAdapter
from conformance.test_scheduler_stateful import make_machine
from refengine.kv_cache.block_pool import hash_block_tokens
from refengine.request import RequestStatus
from refengine.scheduler import Scheduler
from refengine.scheduler.preemption import PreemptionPolicy


# ---- planted bugs -------------------------------------------------------------------------------------------------
class BudgetOffByOne(Scheduler):
    """The waiting pass believes it has one token more than the budget left."""

    def _schedule_waiting(self, step, admit_without_budget=False):
        step.budget += 1
        super()._schedule_waiting(step, admit_without_budget)


class LeakBlockOnAbort(Scheduler):
    """Aborting a running request forgets its last block instead of freeing it."""

    def finish_requests(self, request_ids, status=RequestStatus.FINISHED_ABORTED):
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            blocks = self.kv_cache_manager.req_to_blocks.get(rid)
            if blocks:
                blocks.pop()
        super().finish_requests(request_ids, status)


class AdmitBeforeDecodes(Scheduler):
    """Continuous mode admits waiting requests before the running ones are scheduled."""

    def _schedule_running(self, step, *args, **kwargs):
        if self.config.batching != "continuous":
            return super()._schedule_running(step, *args, **kwargs)
        running = list(self.running)
        self._schedule_waiting(step)
        admitted = self.running[len(running) :]
        self.running = [r for r in running if r.status == RequestStatus.RUNNING]  # minus priority_preemption victims
        super()._schedule_running(step, *args, **kwargs)
        self.running += admitted


class OldestFirstPolicy(PreemptionPolicy):
    def pick_victim(self, running):
        if self.policy == "priority":
            return min(running, key=lambda r: (r.priority, r.arrival_time))
        return running[0]


class OldestVictim(Scheduler):
    """Preempts the least recently admitted (FCFS) / most urgent (priority) request instead of the policy's victim."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.preemption = OldestFirstPolicy(self.config, self.batching.reserves_full_length)


class KeepComputedOnRecompute(Scheduler):
    """A recompute victim keeps its num_computed_tokens although its KV was freed."""

    def _preempt(self, req, step):
        computed = req.num_computed_tokens
        super()._preempt(req, step)
        req.num_computed_tokens = computed


class StaticAdmitsMidBatch(Scheduler):
    """Static / none modes let waiting requests join a batch that is still running."""

    def schedule(self):
        if self.config.batching not in ("static", "none") or not self.running:
            return super().schedule()
        step = self._new_step()
        self._schedule_running(step)
        self._schedule_waiting(step, admit_without_budget=True)
        return self._make_output(step)


class PreemptWithFreeBlock(Scheduler):
    """A watermark off by one: allocation 'fails' unless a block would be left over, so requests are preempted
    while the blocks they need are free."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kv = self.kv_cache_manager
        allocate = kv.allocate_slots

        def allocate_slots(request, num_new_tokens, new_computed_blocks=None, num_tokens_to_fit=0, reserve=False):
            free = kv.block_pool.num_free_blocks
            held = len(kv.req_to_blocks.get(request.request_id, []))
            need = -(-(request.num_computed_tokens + num_new_tokens) // kv.block_size) - held
            if request.status == RequestStatus.RUNNING and need > 0 and need == free:
                return None
            return allocate(request, num_new_tokens, new_computed_blocks, num_tokens_to_fit, reserve)

        kv.allocate_slots = allocate_slots


class SequenceMixesDecodes(Scheduler):
    """Sequence mode lets running decodes ride along with a prefill step (the prefill-only filter is dropped)."""

    def _schedule_running(self, step, *args, **kwargs):
        super()._schedule_running(step)


class DropTokenOnPreempt(Scheduler):
    """Preemption loses the victim's last generated token."""

    def _preempt(self, req, step):
        super()._preempt(req, step)
        if req.output_token_ids and req.num_computed_tokens == 0:
            req.output_token_ids.pop()
            req.all_token_ids.pop()


class PositionOnlyBlockHash(Scheduler):
    """Prefix-cache block hashes ignore the token ids: different prompts share blocks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        kv = self.kv_cache_manager

        def block_hashes(request):
            hashes = kv.req_to_block_hashes.setdefault(request.request_id, [])
            for i in range(len(hashes), request.num_tokens // kv.block_size):
                hashes.append(hash_block_tokens(hashes[-1] if hashes else None, [i]))
            return hashes

        kv.block_hashes = block_hashes


class CachedTokensOfLastAdmission(Scheduler):
    """A readmission after preemption records its own prefix-cache hit (often its own freed blocks) as the
    request's num_cached_tokens, replacing the hit of its first admission."""

    def _admit_waiting(self, step, admit_without_budget, skipped):
        swapped = self.kv_cache_manager.swapped
        recomputed = [r for r in self.waiting if r.status == RequestStatus.PREEMPTED and r.request_id not in swapped]
        super()._admit_waiting(step, admit_without_budget, skipped)
        for r in recomputed:
            if r.status == RequestStatus.RUNNING:
                r.num_cached_tokens = r.num_computed_tokens - step.num_scheduled_tokens.get(r.request_id, 0)


# bug -> (machine's batching modes, KV pressure, the invariant(s) expected to catch it, max_examples)
BITES = {
    BudgetOffByOne: (("continuous",), False, "token_budget", 200),
    LeakBlockOnAbort: (("continuous",), False, "block_accounting|no_leaks", 100),
    # admitting first also takes the blocks the decodes needed: preemption_needed may see it first
    AdmitBeforeDecodes: (("continuous",), False, "decode_first|preemption_needed|token_budget", 150),
    OldestVictim: (("continuous",), True, "preemption_victim", 150),
    KeepComputedOnRecompute: (("continuous",), True, "token_accounting", 150),
    StaticAdmitsMidBatch: (("static", "none"), False, "static_batch", 400),
    PreemptWithFreeBlock: (("continuous",), True, "preemption_needed|progress|liveness", 150),
    SequenceMixesDecodes: (("sequence",), False, "sequence_no_mixing", 250),
    DropTokenOnPreempt: (("continuous",), True, "outputs_kept|token_accounting", 150),
    PositionOnlyBlockHash: (("continuous", "sequence"), False, "block_sharing", 300),
    CachedTokensOfLastAdmission: (("continuous",), True, "cached_tokens", 150),
}
# the engine's own check_invariants may see a bug before the suite's named invariant does: a block hash that is not
# the chained hash of its block's tokens (KVCacheManager.check_invariants, run by the adapter with the requests)
ALSO_CAUGHT_BY_ENGINE = {PositionOnlyBlockHash: r"block \d+'s hash is not that of its tokens"}


def run_against(scheduler_cls, modes, pressure, max_examples, shrink=False) -> None:
    adapter = type(f"{scheduler_cls.__name__}Adapter", (RefEngineAdapter,), {"scheduler_cls": scheduler_cls})
    phases = [Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])
    run_state_machine_as_test(
        make_machine(adapter, modes, pressure),
        settings=settings(
            max_examples=max_examples,
            derandomize=True,
            database=None,
            phases=phases,
            report_multiple_bugs=False,
            deadline=None,
            print_blob=False,
            suppress_health_check=list(HealthCheck),
        ),
    )


# AdmitBeforeDecodes needs the longest search (about 2 minutes of the default run's 18 on 2 shared cores): it runs
# nightly (`-m slow`); the same bug (waiting scheduled before running) is planted every run by
# perf/tests/test_sim_gate.py, which the simulated gate must fail
SLOW_BITES = {AdmitBeforeDecodes}


@pytest.mark.parametrize(
    "scheduler_cls",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_BITES else c for c in BITES],
    ids=lambda c: c.__name__,
)
def test_suite_catches_planted_bug(scheduler_cls):
    modes, pressure, expected, max_examples = BITES[scheduler_cls]
    with pytest.raises(AssertionError) as info:
        run_against(scheduler_cls, modes, pressure, max_examples, shrink=bool(os.environ.get("BITES_SHRINK")))
    caught = re.search(rf"invariant `({expected})` violated", str(info.value))
    by_engine = ALSO_CAUGHT_BY_ENGINE.get(scheduler_cls)
    assert caught or (by_engine and re.search(by_engine, str(info.value))), (
        f"{scheduler_cls.__name__} was caught, but not by `{expected}`:\n{info.value}"
    )
