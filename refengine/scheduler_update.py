"""SchedulerUpdate: the scheduler's bookkeeping around the forward pass and its reports, as a base of `Scheduler`.

`_update_after_schedule` ends schedule(): it describes the step to the runner (RunnerView), then advances
`num_computed_tokens` (vLLM's order; under async scheduling a sampling step leaves an output placeholder).
`update_from_output` takes a step's sampled tokens back: it appends them, runs the stop checks (EOS, stop token
ids, length; stop strings are the output processor's) and finishes the requests they end. `make_stats` reports
the state (vLLM's name), so that no caller reaches into the KV manager or the batching mode.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from refengine.request import Request, RequestStatus
from refengine.scheduler_output import SchedulerOutput
from refengine.scheduler_stats import SchedulerStats

if TYPE_CHECKING:
    from refengine.batching import ContinuousBatching
    from refengine.config import SchedulerConfig
    from refengine.kv_cache_manager import KVCacheManager
    from refengine.request_queue import FCFSQueue, PriorityQueue
    from refengine.scheduler_output import RunnerView


class SchedulerUpdate:
    # (set by Scheduler.__init__)
    config: SchedulerConfig
    kv_cache_manager: KVCacheManager
    runner_view: RunnerView
    requests: dict[str, Request]
    running: list[Request]
    waiting: FCFSQueue | PriorityQueue
    num_steps: int
    finished_req_ids: set[str]
    batching: ContinuousBatching
    num_preemptions: int
    num_swap_outs: int
    num_prefix_cache_queries: int
    num_prefix_cache_hits: int
    clock: Callable[[], float]

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        req.finish_time = self.clock()
        self.kv_cache_manager.remove(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    def _update_after_schedule(self, out: SchedulerOutput) -> None:
        self.runner_view.fill(out, self.requests, self.kv_cache_manager)
        now = self.clock()
        async_sched = self.config.async_scheduling
        requests, is_prefill = self.requests, out.is_prefill
        num_prefill = 0
        for rid, n in out.num_scheduled_tokens.items():
            req = requests[rid]
            req.num_computed_tokens += n
            req.num_in_flight_tokens += n
            if async_sched and req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders:
                req.num_output_placeholders += 1  # not a prefill chunk: it samples a token this step
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            if is_prefill[rid]:
                num_prefill += n
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        out.num_prefill_tokens = num_prefill
        out.num_decode_tokens = out.total_num_scheduled_tokens - num_prefill
        self.num_steps += 1

    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: dict[str, list[int]]) -> list[Request]:
        """Append each request's sampled tokens (a partial prefill samples nothing) and finish those that hit
        EOS, a stop token id or their length limit. Returns the requests finished by this call. Under async
        scheduling `out` is the oldest step whose output has not come back yet (outputs come back in order)."""
        now = self.clock()
        finished: list[Request] = []
        sync = not self.config.async_scheduling
        requests, check_stop = self.requests, self._check_stop
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue  # finished (aborted, stopped) since schedule(): its output is dropped
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:  # (preempted since): delivered, but it resolves no placeholder
                req.num_stale_output_tokens -= n
            toks = sampled_token_ids.get(rid)
            if not toks or (sync and not self._step_samples(req, stale)):
                continue  # partial prefill: whatever was sampled is discarded
            status_before = req.status
            had_placeholders = req.num_output_placeholders > 0
            stop = None
            if req.first_token_time is None:
                req.first_token_time = now
            for tok in toks:
                req.append_output_token_ids((tok,))
                req.token_times.append(now)
                try:  # a stop check that raises fails its own request (aborted, with `error` set), not the step
                    stop = check_stop(req)
                except Exception as exc:  # noqa: BLE001
                    req.error = f"stop check failed: {type(exc).__name__}: {exc}"
                    stop = RequestStatus.FINISHED_ABORTED
                if stop is not None:
                    break
            if not stale and had_placeholders:
                req.num_output_placeholders -= len(toks)
                if status_before == RequestStatus.RUNNING:
                    # the blocks filled by tokens now known and computed become prefix-cache hits (vLLM's
                    # AsyncScheduler caches here; in sync mode the next allocate_slots() does)
                    self.kv_cache_manager.cache_blocks(req, req.num_computed_tokens - req.num_in_flight_tokens)
            if stop is not None:
                if status_before != RequestStatus.RUNNING:
                    self.waiting.remove(req)  # preempted meanwhile, finished by its stale output
                self._finish(req, stop)
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return finished

    @staticmethod
    def _step_samples(req: Request, stale: bool) -> bool:
        """Sync: whether the step whose output is being delivered (the oldest in flight) reached the request's last
        known token, i.e. sampled rather than computed part of a prefill. Its tokens end where the later steps in
        flight begin; of the steps in flight when it was preempted, only the last can have sampled."""
        if stale:
            return req.stale_output_samples and not req.num_stale_output_tokens
        return req.num_computed_tokens - req.num_in_flight_tokens >= req.num_tokens

    def _check_stop(self, req: Request) -> RequestStatus | None:
        sp = req.sampling_params
        num_output = len(req.output_token_ids)
        if num_output >= sp.min_tokens:
            last = req.output_token_ids[-1]
            if not sp.ignore_eos and last in req.eos_token_ids:
                req.stop_reason = None
                return RequestStatus.FINISHED_STOPPED
            if last in req.stop_token_ids:
                req.stop_reason = last
                return RequestStatus.FINISHED_STOPPED
        if num_output >= sp.max_tokens or req.num_tokens >= self.config.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def set_finished_status(self, requests: list[Request], status: RequestStatus) -> None:
        """Give requests finished already (their blocks freed) another finish status: a stop string found in the
        step that also ended the request by EOS or its length decides the reason (as in vLLM), and a request whose
        output failed is reported aborted."""
        for req in requests:
            if not req.is_finished():
                raise ValueError(f"request {req.request_id!r} is not finished: use finish_requests")
            req.status = status

    def make_stats(self, scheduler_output: SchedulerOutput | None = None) -> SchedulerStats:
        """The scheduler's state now (vLLM's name); with `scheduler_output`, also the batch of each request it
        scheduled and of each running one."""
        kv, mode = self.kv_cache_manager, self.batching
        running = [r.request_id for r in self.running]
        scheduled = list(scheduler_output.num_scheduled_tokens) if scheduler_output is not None else []
        return SchedulerStats(
            num_running_reqs=len(running),
            num_waiting_reqs=len(self.waiting),
            running_req_ids=running,
            num_used_blocks=kv.num_used_blocks,
            num_free_blocks=kv.num_free_blocks,
            kv_cache_usage=kv.usage,
            num_preemptions=self.num_preemptions,
            num_swap_outs=self.num_swap_outs,
            prefix_cache_queries=self.num_prefix_cache_queries,
            prefix_cache_hits=self.num_prefix_cache_hits,
            static_batch_id=mode.batch_id,
            batch_ids=mode.batch_ids(scheduled, running),
        )
