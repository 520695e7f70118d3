"""SchedulerPreemption: how the scheduler preempts, as a base of `Scheduler`: the policy's victim (the last admitted
under fcfs, the least urgent under priority), the beyond-vLLM option of preempting to admit a more urgent waiting
request (priority_preemption), and the preemption itself: swap to the host pool or recompute, the step's budget
given back, and the request returned to the front of the waiting queue.
"""

from __future__ import annotations

from refengine.config import PreemptionMode, SchedulingPolicy
from refengine.request import Request, RequestStatus
from refengine.scheduler_output import SchedulerOutput
from refengine.scheduler_update import SchedulerUpdate


class SchedulerPreemption(SchedulerUpdate):
    # (set by Scheduler.__init__ and, for _budget, by each schedule())
    policy: SchedulingPolicy
    _budget: int

    def _pick_victim(self) -> Request:
        if self.policy is SchedulingPolicy.PRIORITY:
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt_for(self, req: Request, out: SchedulerOutput) -> bool:
        """Beyond vLLM (option priority_preemption): a waiting request strictly more urgent than the least urgent
        running one preempts it to get in."""
        if not self.config.priority_preemption or not self.running or self.batching.reserves_full_length:
            return False  # the reserving modes (sequence / static / none) never preempt
        victim = self._pick_victim()
        if victim.priority <= req.priority:
            return False
        self._preempt(victim, out)
        return True

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        kv = self.kv_cache_manager
        # (sync, no placeholders: a step in flight samples iff it reached the last known token; decided before a
        # recompute forgets num_computed_tokens, so that its token is not mistaken for a partial prefill's)
        req.stale_output_samples = bool(req.num_in_flight_tokens) and req.num_computed_tokens >= req.num_tokens
        self.running.remove(req)
        n = out.num_scheduled_tokens.pop(req.request_id, None)
        if n is not None:  # scheduled earlier in this step: give its tokens back
            self._budget += n
            out.is_prefill.pop(req.request_id)
        plan = kv.swap_out(req) if self.config.preemption_mode is PreemptionMode.SWAP else None
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
        self.waiting.prepend(req)
