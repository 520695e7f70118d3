"""Scheduling: which requests run in each step and with how many tokens (vLLM V1's core/sched/).

`Scheduler` (scheduler.py) owns the requests, the waiting queue (request_queue.py) and the step's token budget; the
batching mode (batching.py) and the preemption policy (preemption.py) decide who may run together and who gives
way; `SchedulerOutput` (scheduler_output.py) is what a step hands the model runner. Public names, as vLLM spells
them: `from refengine.scheduler import Scheduler, SchedulerOutput`.
"""

from refengine.scheduler.scheduler import Scheduler
from refengine.scheduler.scheduler_output import SchedulerOutput

__all__ = ["Scheduler", "SchedulerOutput"]
