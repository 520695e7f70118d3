"""StepStats: what one engine step did, built from the step's SchedulerOutput and the scheduler's stats.

The perf suite turns these into utilisation figures and slot timelines, from these fields alone (it never looks
inside the scheduler); the server's metrics read the counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from refengine.scheduler.scheduler_output import SchedulerOutput
from refengine.scheduler.scheduler_stats import SchedulerStats


@dataclass
class StepStats:
    time: float
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    num_preempted: int
    scheduled_req_ids: list[str]
    running_req_ids: list[str]
    # the scheduled requests whose tokens this step are prompt tokens (or recomputed ones after a preemption)
    prefill_req_ids: list[str] = field(default_factory=list)
    # static batching: the batch (1, 2, ...) of every scheduled or running request, which holds its slot until the
    # whole batch has left; None in the other modes, where a finished request frees its slot at once
    batch_ids: dict[str, int | None] = field(default_factory=dict)
    # whether the step's forward replayed a CUDA graph (refengine/worker/cuda_graphs.py); None where no forward ran
    # on a device: a simulated GPU, or a step whose forward failed
    cuda_graph: bool | None = None

    @classmethod
    def of_step(
        cls, out: SchedulerOutput, stats: SchedulerStats, now: float, cuda_graph: bool | None = None
    ) -> StepStats:
        """`stats`: Scheduler.make_stats(out), taken once the step's output has been processed; `now`: the engine
        clock's time (virtual on a simulated GPU); `cuda_graph`: ModelRunnerOutput.cuda_graph."""
        prefill = [rid for rid, p in out.is_prefill.items() if p] if out.num_prefill_tokens else []
        return cls(
            time=now,
            num_scheduled_tokens=out.total_num_scheduled_tokens,
            num_prefill_tokens=out.num_prefill_tokens,
            num_decode_tokens=out.num_decode_tokens,
            num_running=stats.num_running_reqs,
            num_waiting=stats.num_waiting_reqs,
            kv_blocks_used=stats.num_used_blocks,
            num_preempted=len(out.preempted_req_ids),
            scheduled_req_ids=list(out.num_scheduled_tokens),
            running_req_ids=stats.running_req_ids,
            prefill_req_ids=prefill,
            batch_ids=stats.batch_ids,
            cuda_graph=cuda_graph,
        )
