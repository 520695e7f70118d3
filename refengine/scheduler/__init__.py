"""Scheduling: which requests run in each step and with how many tokens (vLLM V1's core/sched/).

`Scheduler` (scheduler.py) owns the requests, the waiting queue (request_queue.py), the step's token budget and
every change to a request's state; it builds each step's `SchedulerOutput` (scheduler_output.py, what a step hands
the model runner) in one place, at the end of `schedule()`. Two policy objects answer it with decisions: the
batching mode (batching.py: which passes a step runs, in what order) and the preemption policy (preemption.py: who
gives way). Public names, as vLLM spells them: `from refengine.scheduler import Scheduler, SchedulerOutput`.
"""

from refengine.scheduler.scheduler import Scheduler
from refengine.scheduler.scheduler_output import SchedulerOutput

__all__ = ["Scheduler", "SchedulerOutput"]
