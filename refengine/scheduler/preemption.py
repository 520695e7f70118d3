"""PreemptionPolicy: the scheduler's collaborator for preemption, who gives way when a block cannot be had, and how.

- The victim (`pick_victim`): under fcfs the most recently admitted running request, under priority the least
  urgent one, the largest (priority, arrival_time).
- Beyond vLLM, with priority_preemption: a waiting request strictly more urgent than that victim preempts it to
  get in (`victim_to_admit`); the modes that reserve blocks at admission (sequence / static / none) never do.
- The preemption itself (`preempt`): the victim leaves the running set (and this step, if it was scheduled in it);
  its KV is swapped out to the host pool (preemption_mode="swap", when the host pool can take it) or forgotten to
  be recomputed (its blocks freed, its computed tokens back to 0, its generated tokens kept); it is marked
  PREEMPTED and goes to the front of the waiting queue. The step's token budget stays the scheduler's: `preempt`
  returns the tokens the victim had in this step, for `Scheduler._preempt` to give back.
"""

from __future__ import annotations

from refengine.config import PreemptionMode, SchedulerConfig, SchedulingPolicy
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.request import Request, RequestStatus
from refengine.scheduler.request_queue import FCFSQueue, PriorityQueue
from refengine.scheduler.scheduler_output import SchedulerOutput


class PreemptionPolicy:
    def __init__(self, config: SchedulerConfig, kv_cache_manager: KVCacheManager, reserves_full_length: bool) -> None:
        self.policy = SchedulingPolicy(config.policy)
        self.mode = PreemptionMode(config.preemption_mode)
        self.preempts_to_admit = config.priority_preemption and not reserves_full_length
        self.kv_cache_manager = kv_cache_manager
        self.num_preemptions = 0
        self.num_swap_outs = 0  # the preemptions that went to the host pool rather than recompute

    def pick_victim(self, running: list[Request]) -> Request:
        """The running request that gives way (`running` in admission order, not empty)."""
        if self.policy is SchedulingPolicy.PRIORITY:
            return max(running, key=lambda r: (r.priority, r.arrival_time))
        return running[-1]

    def victim_to_admit(self, req: Request, running: list[Request]) -> Request | None:
        """The running request that waiting `req` preempts to get in (priority_preemption), or None."""
        if not self.preempts_to_admit or not running:
            return None
        victim = self.pick_victim(running)
        return victim if victim.priority > req.priority else None

    def preempt(
        self, req: Request, out: SchedulerOutput, running: list[Request], waiting: FCFSQueue | PriorityQueue
    ) -> int:
        """Preempt running `req` in the step being scheduled (`out`); returns the tokens it had scheduled in it."""
        kv = self.kv_cache_manager
        # (sync, no placeholders: a step in flight samples iff it reached the last known token; decided before a
        # recompute forgets num_computed_tokens, so that its token is not mistaken for a partial prefill's)
        req.stale_output_samples = bool(req.num_in_flight_tokens) and req.num_computed_tokens >= req.num_tokens
        running.remove(req)
        n = out.num_scheduled_tokens.pop(req.request_id, None)
        if n is not None:  # scheduled earlier in this step: out of it again
            out.is_prefill.pop(req.request_id)
        plan = kv.swap_out(req) if self.mode is PreemptionMode.SWAP else None
        if plan is not None:
            out.blocks_to_swap_out.extend(plan)
            self.num_swap_outs += 1
        else:  # recompute (or swap with a full host pool): forget the KV, keep the generated tokens
            kv.free(req)
            req.num_lost_tokens = req.num_computed_tokens
            req.num_computed_tokens = 0
        # async: the output of steps in flight becomes stale: still appended when it comes back, but it no longer
        # resolves placeholders (there are none after a preemption) nor advances any counter
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted_req_ids.append(req.request_id)
        waiting.prepend(req)
        return n or 0
