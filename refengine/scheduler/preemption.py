"""PreemptionPolicy: who gives way when a block cannot be had, as a decision the scheduler acts on.

- The victim (`pick_victim`): under fcfs the most recently admitted running request, under priority the least
  urgent one, the largest (priority, arrival_time).
- Beyond vLLM, with priority_preemption: a waiting request strictly more urgent than that victim preempts it to
  get in (`victim_to_admit`); the modes that reserve blocks at admission (sequence / static / none) never do.

The policy only names requests. The preemption itself (the victim leaves the running set and the step, its KV is
swapped out or forgotten, it goes back to the front of the waiting queue) is `Scheduler._preempt`, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

from refengine.config import SchedulerConfig, SchedulingPolicy
from refengine.request import Request


class PreemptionPolicy:
    def __init__(self, config: SchedulerConfig, reserves_full_length: bool) -> None:
        self.policy = SchedulingPolicy(config.policy)
        self.preempts_to_admit = config.priority_preemption and not reserves_full_length

    def pick_victim(self, running: Sequence[Request]) -> Request:
        """The running request that gives way (`running` in admission order, not empty)."""
        if self.policy is SchedulingPolicy.PRIORITY:
            return max(running, key=lambda r: (r.priority, r.arrival_time))
        return running[-1]

    def victim_to_admit(self, req: Request, running: Sequence[Request]) -> Request | None:
        """The running request that waiting `req` preempts to get in (priority_preemption), or None."""
        if not self.preempts_to_admit or not running:
            return None
        victim = self.pick_victim(running)
        return victim if victim.priority > req.priority else None
