"""SchedulerUpdate: the scheduler's update step, its bookkeeping on either side of the forward pass.

`after_schedule` ends schedule(): it describes the step to the runner (RunnerView), then advances
`num_computed_tokens` (vLLM's order; under async scheduling a sampling step leaves an output placeholder).
`update_from_output` takes a step's sampled tokens back: it appends them, runs the stop checks (EOS, stop token
ids, length; stop strings are the output processor's) and finishes the requests they end. `finish` is the one way
a request ends (stop checks and aborts alike): its blocks freed, its id kept to tell the runner at the next step.

It shares the scheduler's `requests` and waiting queue (the same objects); the scheduler keeps its running list.

Async scheduling (`async_scheduling=True`, vLLM's AsyncScheduler): schedule() for step N+1 runs before step N's
output is back. A step that samples leaves a placeholder (`num_output_placeholders`) that the next schedule()
treats as a known token (a decode schedules it as its input); the real token replaces it in update_from_output(),
where the stop checks run. A request whose in-flight token reaches max_tokens is not scheduled again; one preempted
while a step is in flight still gets that step's output appended (its "stale" output; it may even finish by it) and
is not re-admitted before that output is back; a step's output for a request that has finished since is dropped.
The sync scheduler may likewise be driven with two schedule() calls outstanding (vLLM's base Scheduler allows it):
a request preempted between them still gets the earlier step's token, unless that step was a partial prefill.
"""

from __future__ import annotations

from collections.abc import Callable

from refengine.config import SchedulerConfig
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.request import Request, RequestStatus
from refengine.scheduler.request_queue import FCFSQueue, PriorityQueue
from refengine.scheduler.scheduler_output import RunnerView, SchedulerOutput


class SchedulerUpdate:
    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        requests: dict[str, Request],
        waiting: FCFSQueue | PriorityQueue,
    ) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.requests, self.waiting = requests, waiting
        self.runner_view = RunnerView()  # what the model runner has been told (builds each output's request data)
        self.finished_req_ids: set[str] = set()  # finished since the last schedule(): the runner forgets them

    def finish(self, req: Request, status: RequestStatus, now: float) -> None:
        """End a request that is no longer running nor waiting: its KV freed, the scheduler forgets it."""
        req.status = status
        req.finish_time = now
        self.kv_cache_manager.remove(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    def take_finished_req_ids(self) -> set[str]:
        """The ids finished since the last call, for the next SchedulerOutput."""
        finished, self.finished_req_ids = self.finished_req_ids, set()
        return finished

    def after_schedule(self, out: SchedulerOutput, now: float) -> None:
        """Describe the step to the runner, then advance the scheduled requests' computed tokens."""
        requests, is_prefill = self.requests, out.is_prefill
        self.runner_view.fill(out, requests, self.kv_cache_manager)
        async_sched = self.config.async_scheduling
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

    def update_from_output(
        self, out: SchedulerOutput, sampled_token_ids: dict[str, list[int]], clock: Callable[[], float]
    ) -> list[Request]:
        """Append each request's sampled tokens (a partial prefill samples nothing) and finish those that hit
        EOS, a stop token id or their length limit. Returns the requests finished by this call. Under async
        scheduling `out` is the oldest step whose output has not come back yet (outputs come back in order)."""
        now = clock()
        finished: list[Request] = []
        sync = not self.config.async_scheduling
        requests, check_stop = self.requests, self.check_stop
        for rid, n in out.num_scheduled_tokens.items():
            req = requests.get(rid)
            if req is None:
                continue  # finished (aborted, stopped) since schedule(): its output is dropped
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:  # (preempted since): delivered, but it resolves no placeholder
                req.num_stale_output_tokens -= n
            toks = sampled_token_ids.get(rid)
            if not toks or (sync and not self.step_samples(req, stale)):
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
                self.finish(req, stop, clock())
                finished.append(req)
        return finished

    @staticmethod
    def step_samples(req: Request, stale: bool) -> bool:
        """Sync: whether the step whose output is being delivered (the oldest in flight) reached the request's last
        known token, i.e. sampled rather than computed part of a prefill. Its tokens end where the later steps in
        flight begin; of the steps in flight when it was preempted, only the last can have sampled."""
        if stale:
            return req.stale_output_samples and not req.num_stale_output_tokens
        return req.num_computed_tokens - req.num_in_flight_tokens >= req.num_tokens

    def check_stop(self, req: Request) -> RequestStatus | None:
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
