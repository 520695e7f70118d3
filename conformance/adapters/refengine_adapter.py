"""The reference adapter: refengine's own Scheduler through the SchedulerAdapter surface."""

from __future__ import annotations

from collections import deque

from conformance.adapters import ReqView, StepView
from refengine.request import Request, RequestStatus
from refengine.sampling_params import SamplingParams
from refengine.scheduler import Scheduler
from refengine.scheduler.scheduler_output import SchedulerOutput

_STATUS = {RequestStatus.WAITING: "waiting", RequestStatus.RUNNING: "running", RequestStatus.PREEMPTED: "preempted"}


class RefEngineAdapter:
    name = "refengine"
    scheduler_cls = Scheduler  # a test may swap in a deliberately broken subclass

    @classmethod
    def supports(cls, knobs: dict) -> str | None:
        return None  # every engine knob is refengine's own

    def __init__(self, eos_token_id: int | None = None, **knobs) -> None:
        self.sched = self.scheduler_cls(eos_token_id=eos_token_id, **knobs)
        self.block_size = self.sched.config.block_size
        self.num_gpu_blocks = self.sched.config.num_gpu_blocks
        self.num_cpu_blocks = self.sched.config.num_cpu_blocks
        self._all: dict[str, Request] = {}
        self._in_flight: deque[SchedulerOutput] = deque()  # scheduled, output not fed yet (async: up to two)

    def add_request(
        self,
        request_id,
        prompt_token_ids,
        *,
        max_tokens,
        priority=0,
        arrival_time=0.0,
        min_tokens=0,
        ignore_eos=False,
        stop_token_ids=None,
    ) -> None:
        sp = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            temperature=0.0,
            ignore_eos=ignore_eos,
            stop_token_ids=stop_token_ids,
        )
        req = Request(request_id, prompt_token_ids, sp, priority=priority, arrival_time=arrival_time)
        self._all[request_id] = req
        self.sched.add_request(req)

    def schedule(self) -> StepView:
        waiting_before = {r.request_id for r in self.sched.waiting}
        out = self.sched.schedule()
        self._in_flight.append(out)
        return StepView(
            num_scheduled_tokens=dict(out.num_scheduled_tokens),
            preempted_req_ids=list(out.preempted_req_ids),
            # admitted from waiting and scheduled in this step (the runner contract's "new" means something else:
            # first met by the runner, which a static batch member is only at its first chunk)
            new_req_ids=[
                rid for rid in out.num_scheduled_tokens if rid in waiting_before or rid in out.preempted_req_ids
            ],
            blocks_to_swap_out=list(out.blocks_to_swap_out),
            blocks_to_swap_in=list(out.blocks_to_swap_in),
        )

    def update(self, sampled):
        return [r.request_id for r in self.sched.update_from_output(self._in_flight.popleft(), sampled)]

    def abort(self, request_ids):
        self.sched.finish_requests(list(request_ids))

    def _view(self, r: Request) -> ReqView:
        return ReqView(
            request_id=r.request_id,
            status=_STATUS.get(r.status, "finished"),
            num_prompt_tokens=r.num_prompt_tokens,
            num_output_tokens=r.num_output_tokens,
            num_computed_tokens=r.num_computed_tokens,
            priority=r.priority,
            arrival_time=r.arrival_time,
            block_ids=self.sched.kv_cache_manager.get_block_ids(r.request_id),
            num_preemptions=r.num_preemptions,
            finish_reason=r.get_finished_reason(),
            host_block_ids=[b.block_id for b in self.sched.kv_cache_manager.swapped.get(r.request_id, [])],
            num_output_placeholders=r.num_output_placeholders,
            max_tokens=r.max_tokens,
            num_cached_tokens=r.num_cached_tokens,
        )

    def running(self):
        return [self._view(r) for r in self.sched.running]

    def waiting(self):
        return [self._view(r) for r in self.sched.waiting]

    def request(self, request_id):
        return self._view(self._all[request_id])

    def num_free_blocks(self):
        return self.sched.num_free_blocks

    def block_ref_counts(self):
        return {b.block_id: b.ref_cnt for b in self.sched.kv_cache_manager.block_pool.blocks}

    def host_block_ref_counts(self):
        return {b.block_id: b.ref_cnt for b in self.sched.kv_cache_manager.host_pool.blocks}

    def check_invariants(self):
        self.sched.check_invariants()
        # and, with the requests' tokens at hand, that every block hash is of a full block of them
        self.sched.kv_cache_manager.check_invariants(self.sched.requests)
