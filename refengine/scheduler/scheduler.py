"""Scheduler: token-level, iteration-level scheduling as in vLLM V1, and the three modes the engine compares it to.

The rules it follows are written out in docs/scheduling.md. The scheduler owns the requests, its queues, the
step's token budget and every change to a request's state (only it sets `Request.status`). Two policy objects
answer it with decisions and change none of that state:
- the batching mode (refengine/scheduler/batching.py) plans a step: which passes run, in what order, with which
  options: the running pass (`_schedule_running`: each running request gets min(tokens left,
  long_prefill_token_threshold, budget)) and the waiting pass (`_schedule_waiting`: a request is admitted only
  when blocks for its whole prompt can be had);
- the preemption policy (refengine/scheduler/preemption.py) names the victim when a block cannot be had;
  `_preempt` preempts it (swap or recompute, back to the front of the waiting queue) and gives its tokens back to
  the budget.
The passes collect their decisions in a `_Step`; `_make_output` turns them into the step's `SchedulerOutput` in one
constructor call at the end of `schedule()`, after the runner's view of each request (RunnerView) and before
`num_computed_tokens` advances, as vLLM orders it. `update_from_output()` takes a step's sampled tokens back,
appends them, runs the stop checks (EOS, stop token ids, length; stop strings are the output processor's) and
finishes the requests they end; `finish_requests` is how the engine ends the others (aborts, stop strings).

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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from refengine.config import PreemptionMode, SchedulerConfig, SchedulingPolicy
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.limits import cdiv, max_kv_tokens
from refengine.request import Request, RequestStatus
from refengine.scheduler.batching import PassKind, make_batching
from refengine.scheduler.preemption import PreemptionPolicy
from refengine.scheduler.request_queue import create_request_queue
from refengine.scheduler.scheduler_output import RunnerView, SchedulerOutput
from refengine.scheduler.scheduler_stats import SchedulerStats


@dataclass(slots=True)
class _Step:
    """The decisions of the step being scheduled, as its passes make them (what becomes its SchedulerOutput)."""

    budget: int  # tokens still free this step
    threshold: int  # per-request cap on a step's tokens (0: none)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # in scheduling order
    is_prefill: dict[str, bool] = field(default_factory=dict)
    preempted_req_ids: list[str] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)


class Scheduler:
    def __init__(
        self, config: SchedulerConfig | None = None, *, eos_token_id: int | Sequence[int] | None = None, **knobs: object
    ) -> None:
        """`Scheduler(config)` with a SchedulerConfig, or `Scheduler(**knobs)` with its fields by keyword."""
        self.config = c = SchedulerConfig.of(config, knobs)
        self.eos_token_id = eos_token_id
        self.batching = make_batching(c)
        self.preemption = PreemptionPolicy(c, self.batching.reserves_full_length)
        self.preemption_mode = PreemptionMode(c.preemption_mode)  # how a victim gives way: swap or recompute
        self.kv_cache_manager = KVCacheManager(
            c.num_gpu_blocks, c.block_size, c.enable_prefix_caching, c.num_cpu_blocks
        )
        self.waiting = create_request_queue(c.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.runner_view = RunnerView()  # what the model runner has been told (each output's request data)
        self.finished_req_ids: set[str] = set()  # finished since the last schedule(): the runner forgets them
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_swap_outs = 0  # the preemptions that went to the host pool rather than recompute
        self.num_prefix_cache_queries = 0  # tokens of admitted requests (vLLM's PrefixCacheStats.queries)
        self.num_prefix_cache_hits = 0  # of those, tokens found in the prefix cache
        # the same for readmissions after a recompute preemption, counted apart as vLLM does (preempted_queries /
        # preempted_hits): a victim that hits its own freed blocks again would otherwise raise the hit rate
        self.num_prefix_cache_preempted_queries = 0
        self.num_prefix_cache_preempted_hits = 0
        # every timestamp the scheduler sets; the engine swaps in its clock (a virtual one on a simulated GPU)
        self.clock: Callable[[], float] = time.monotonic

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request (WAITING). ValueError, and nothing queued, for a request_id in use or an empty prompt (a
        request with no token to compute could never be scheduled, nor finish). Like vLLM's scheduler, it does not
        judge whether the KV cache can ever hold the request: the engine's Processor refuses that before it gets here."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        if not request.prompt_token_ids:
            raise ValueError(
                f"request {request.request_id!r}: prompt_token_ids is empty; a request needs a prompt token"
            )
        if request.eos_token_ids == frozenset() and self.eos_token_id is not None:
            request.eos_token_ids = frozenset(
                [self.eos_token_id] if isinstance(self.eos_token_id, int) else self.eos_token_id
            )
        self.requests[request.request_id] = request
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def finish_requests(
        self, request_ids: str | list[str], status: RequestStatus = RequestStatus.FINISHED_ABORTED
    ) -> None:
        """End requests that are running or waiting (aborts, stop strings); finished or unknown ids are ignored."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            self._finish(req, status, self.clock())

    def set_finished_status(self, requests: list[Request], status: RequestStatus) -> None:
        """Give requests finished already (their blocks freed) another finish status: a stop string found in the
        step that also ended the request by EOS or its length decides the reason (as in vLLM), and a request whose
        output failed is reported aborted."""
        for req in requests:
            if not req.is_finished():
                raise ValueError(f"request {req.request_id!r} is not finished: use finish_requests")
            req.status = status

    def _finish(self, req: Request, status: RequestStatus, now: float) -> None:
        """End a request that is no longer running nor waiting: its KV freed, the scheduler forgets it, and the
        next step tells the runner (the one way a request ends: stop checks and aborts alike)."""
        req.status = status
        req.finish_time = now
        self.kv_cache_manager.remove(req)
        self.finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's Scheduler.reset_prefix_cache without reset_running_requests): refused,
        False and nothing changed, while any request holds a KV block."""
        return self.kv_cache_manager.reset_prefix_cache()

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks

    # ---- schedule -------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """One step: the passes the batching mode plans, then the SchedulerOutput of their decisions."""
        step = self._new_step()
        for p in self.batching.plan(self.running):
            if (p.unless_preempted and step.preempted_req_ids) or (p.unless_scheduled and step.num_scheduled_tokens):
                continue
            if p.kind is PassKind.RUNNING:
                self._schedule_running(step, p.prefill_only)
            else:
                self._schedule_waiting(step, p.admit_without_budget)
        return self._make_output(step)

    def _new_step(self) -> _Step:
        # The long-prefill cap exists so that one prefill cannot starve the others; alone, a request has no one to
        # starve and uses the whole budget (as vLLM does).
        lone = len(self.running) + len(self.waiting) <= 1
        return _Step(self.config.max_num_batched_tokens, 0 if lone else self.config.long_prefill_token_threshold)

    def _num_new_tokens(self, step: _Step, req: Request, num_computed: int) -> int:
        n = req.num_tokens + req.num_output_placeholders - num_computed
        if 0 < step.threshold < n:
            n = step.threshold
        # the token at position max_model_len - 1 is the last one a request may hold: its KV is never needed
        return min(n, self.config.max_model_len - 1 - num_computed)

    def _tokens_to_fit(self, req: Request) -> int:
        """Tokens whose KV must be placeable for admission: the whole prompt (+ generated tokens), or the whole
        request up to max_tokens in the modes that reserve at admission."""
        if self.batching.reserves_full_length:
            return max_kv_tokens(req.num_prompt_tokens, req.max_tokens, self.config.max_model_len)
        return req.num_tokens

    def _schedule_running(self, step: _Step, prefill_only: bool = False) -> None:
        """Running requests in admission order; `prefill_only` (sequence mode) skips those that would decode.
        This loop runs for every running request every step, so _num_new_tokens, in_prefill and _schedule are
        inlined here (the same rules, kept in step by refengine/tests/test_hot_loop.py), and the KV manager is
        asked for slots only when the request may need a block or has one to cache (`has_room`)."""
        kv, c = self.kv_cache_manager, self.config
        running, scheduled, is_prefill = self.running, step.num_scheduled_tokens, step.is_prefill
        threshold, last_pos, chunked = step.threshold, c.max_model_len - 1, c.enable_chunked_prefill
        budget, priority = step.budget, self.preemption.policy is SchedulingPolicy.PRIORITY
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            computed, placeholders = req.num_computed_tokens, req.num_output_placeholders
            if placeholders and computed + 2 - placeholders >= req.num_prompt_tokens + req.sampling_params.max_tokens:
                i += 1  # async: the token in flight is its last (max_tokens); no step after it is needed
                continue
            full = req.num_tokens + placeholders - computed
            if 0 < threshold < full:
                full = threshold
            if full > last_pos - computed:  # the token at max_model_len - 1 is the last one; its KV is never needed
                full = last_pos - computed
            n = full if full < budget else budget
            in_prefill = computed < max(req.num_prompt_tokens, req.num_tokens - 1)
            if n <= 0 or (n < full and not chunked) or (prefill_only and not in_prefill):
                i += 1  # nothing to do, a prefill that may not be split and does not fit, or not this kind of step
                continue
            if not kv.has_room(req, n):
                step.budget = budget
                while kv.allocate_slots(req, n) is None:
                    victim = self.preemption.pick_victim(running)
                    if running.index(victim) < i:
                        i -= 1  # (priority policy) an earlier, already scheduled request gave way
                    self._preempt(victim, step)
                    if victim is req:
                        break
                budget = step.budget  # (a preempted victim that was scheduled gave its tokens back)
                if req.status != RequestStatus.RUNNING:
                    if priority:
                        continue  # it was the least urgent: the (more urgent) ones after it may still fit
                    break  # FCFS: it was the last admitted, so nobody follows it
            scheduled[req.request_id] = n
            is_prefill[req.request_id] = in_prefill
            budget -= n
            i += 1
        step.budget = budget

    def _schedule_waiting(self, step: _Step, admit_without_budget: bool = False) -> None:
        skipped: list[Request] = []
        try:
            self._admit_waiting(step, admit_without_budget, skipped)
        finally:  # requests passed over this step go back to the front, in their order (vLLM's skip_request)
            for req in reversed(skipped):
                self.waiting.prepend(req)

    def _admit_waiting(self, step: _Step, admit_without_budget: bool, skipped: list[Request]) -> None:
        kv, c, mode = self.kv_cache_manager, self.config, self.batching
        max_seqs, reserve = mode.max_num_seqs, mode.reserves_full_length
        while self.waiting and (step.budget > 0 or admit_without_budget):
            req = self.waiting.peek()
            if req.num_stale_output_tokens:
                # async: preempted with a step in flight; resuming now could resample the position that step's
                # output is about to deliver. It drains by the next step.
                skipped.append(self.waiting.pop())
                continue
            if len(self.running) >= max_seqs:
                if self._preempt_for(req, step):
                    continue
                break
            swapped = req.request_id in kv.swapped
            hits, num_computed = ([], req.num_computed_tokens) if swapped else kv.get_computed_blocks(req)
            n = self._num_new_tokens(step, req, num_computed)
            if not c.enable_chunked_prefill and n > step.budget:
                if not admit_without_budget:
                    break  # head of line: the whole prompt must go in one step
                n = 0  # static batch member: joins now, prefills in a later step of the same batch
            n = min(n, step.budget)
            fit = self._tokens_to_fit(req)
            if swapped:
                plan = kv.swap_in(req, n, fit, reserve)
                ok = plan is not None
                step.blocks_to_swap_in.extend(plan or ())
            else:
                ok = kv.allocate_slots(req, n, hits, fit, reserve) is not None
            if not ok:
                if self._preempt_for(req, step):
                    continue
                break
            self.waiting.pop()
            if not swapped:
                if req.status == RequestStatus.PREEMPTED:
                    req.num_recomputed_tokens += max(0, req.num_lost_tokens - num_computed)
                req.num_computed_tokens = num_computed
                if req.num_cached_tokens < 0:  # the first admission's hit: what usage and metrics report
                    req.num_cached_tokens = num_computed
                if req.num_preemptions:
                    self.num_prefix_cache_preempted_queries += req.num_tokens
                    self.num_prefix_cache_preempted_hits += num_computed
                else:
                    self.num_prefix_cache_queries += req.num_tokens
                    self.num_prefix_cache_hits += num_computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            mode.on_admit(req.request_id)
            if n > 0:
                self._schedule(step, req, n)

    def _schedule(self, step: _Step, req: Request, n: int) -> None:
        step.num_scheduled_tokens[req.request_id] = n
        # (inline in_prefill: this runs for every request every step)
        step.is_prefill[req.request_id] = req.num_computed_tokens < max(req.num_prompt_tokens, req.num_tokens - 1)
        step.budget -= n

    def _make_output(self, step: _Step) -> SchedulerOutput:
        """The step's SchedulerOutput, in one place: the runner's view of the scheduled requests is taken before
        their computed tokens advance (vLLM's order; under async scheduling a sampling step leaves an output
        placeholder)."""
        requests, scheduled, is_prefill = self.requests, step.num_scheduled_tokens, step.is_prefill
        finished, self.finished_req_ids = self.finished_req_ids, set()
        now = self.clock()
        new_reqs, cached_reqs = self.runner_view.describe(scheduled, finished, requests, self.kv_cache_manager)
        async_sched = self.config.async_scheduling
        num_prefill = 0
        for rid, n in scheduled.items():
            req = requests[rid]
            req.num_computed_tokens += n
            req.num_in_flight_tokens += n
            if async_sched and req.num_computed_tokens >= req.num_tokens + req.num_output_placeholders:
                req.num_output_placeholders += 1  # not a prefill chunk: it samples a token this step
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            if is_prefill[rid]:
                num_prefill += n
        total = sum(scheduled.values())
        self.num_steps += 1
        self.kv_cache_manager.end_step()
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=scheduled,
            total_num_scheduled_tokens=total,
            is_prefill=is_prefill,
            preempted_req_ids=step.preempted_req_ids,
            finished_req_ids=finished,
            blocks_to_swap_out=step.blocks_to_swap_out,
            blocks_to_swap_in=step.blocks_to_swap_in,
            num_prefill_tokens=num_prefill,
            num_decode_tokens=total - num_prefill,
        )

    # ---- preemption -----------------------------------------------------------------------------------------
    def _preempt(self, req: Request, step: _Step) -> None:
        """Preempt running `req`, the policy's victim: it leaves the running set (and this step, if it was scheduled
        in it, its tokens going back to the budget); its KV is swapped out to the host pool (preemption_mode="swap",
        when the host pool can take it) or forgotten to be recomputed (its blocks freed, its computed tokens back to
        0, its generated tokens kept); it is marked PREEMPTED and goes to the front of the waiting queue."""
        kv = self.kv_cache_manager
        # (sync, no placeholders: a step in flight samples iff it reached the last known token; decided before a
        # recompute forgets num_computed_tokens, so that its token is not mistaken for a partial prefill's)
        req.stale_output_samples = bool(req.num_in_flight_tokens) and req.num_computed_tokens >= req.num_tokens
        self.running.remove(req)
        n = step.num_scheduled_tokens.pop(req.request_id, None)
        if n is not None:  # scheduled earlier in this step: out of it again
            step.is_prefill.pop(req.request_id)
            step.budget += n
        plan = kv.swap_out(req) if self.preemption_mode is PreemptionMode.SWAP else None
        if plan is not None:
            step.blocks_to_swap_out.extend(plan)
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
        step.preempted_req_ids.append(req.request_id)
        self.waiting.prepend(req)

    def _preempt_for(self, req: Request, step: _Step) -> bool:
        """Beyond vLLM (priority_preemption): preempt the running request that waiting `req` outranks, if any."""
        victim = self.preemption.victim_to_admit(req, self.running)
        if victim is None:
            return False
        self._preempt(victim, step)
        return True

    # ---- outputs --------------------------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: dict[str, list[int]]) -> list[Request]:
        """Append each request's sampled tokens (a partial prefill samples nothing) and finish those that hit
        EOS, a stop token id or their length limit. Returns the requests finished by this call. Under async
        scheduling `out` is the oldest step whose output has not come back yet (outputs come back in order)."""
        clock = self.clock
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
            if not toks or (sync and not _step_samples(req, stale)):
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
                self._finish(req, stop, clock())
                finished.append(req)
        if finished:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return finished

    def check_stop(self, req: Request) -> RequestStatus | None:
        """The finish status its newest token gives `req` (EOS, a stop token id, its length limit), or None."""
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

    def make_stats(self, scheduler_output: SchedulerOutput | None = None) -> SchedulerStats:
        """The scheduler's state now (vLLM's name), the only way the engine, the server's metrics and perf read it;
        with `scheduler_output`, also the batch of each request it scheduled and of each running one."""
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
            prefix_cache_preempted_queries=self.num_prefix_cache_preempted_queries,
            prefix_cache_preempted_hits=self.num_prefix_cache_preempted_hits,
            static_batch_id=mode.batch_id,
            batch_ids=mode.batch_ids(scheduled, running),
        )

    # ---- self-check -----------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The state every step must leave behind, as assertions; the conformance suite calls this after every
        step."""
        c, kv, mode, running = self.config, self.kv_cache_manager, self.batching, self.running
        kv.check_invariants()
        limit = mode.max_num_seqs  # (max_num_seqs; 1 without batching)
        assert len(running) <= limit, f"{len(running)} running > {limit} allowed"
        waiting = list(self.waiting)
        assert not set(map(id, waiting)) & set(map(id, running)), "a request is both waiting and running"
        for r in running:
            assert r.status == RequestStatus.RUNNING, r
            held = kv.get_num_blocks(r.request_id)
            need = cdiv(r.num_computed_tokens, c.block_size)
            if mode.reserves_full_length:
                assert held >= need, f"{r} holds {held} blocks, needs {need}"
            else:
                assert held == need, f"{r} holds {held} blocks, its computed tokens need {need}"
        for r in running + waiting:
            p, f, st = r.num_output_placeholders, r.num_in_flight_tokens, r.num_stale_output_tokens
            assert p >= 0 and 0 <= st <= f, f"{r}: placeholders {p}, in flight {f}, stale {st}"
            assert c.async_scheduling or not p, f"{r} has {p} output placeholders without async scheduling"
        for r in waiting:
            assert not r.num_output_placeholders, f"waiting {r} has output placeholders"
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), r
            assert not kv.get_num_blocks(r.request_id), f"waiting {r} holds blocks"
            assert (r.request_id in kv.swapped) == (r.num_computed_tokens > 0), f"waiting {r} computed tokens vs swap"


def _step_samples(req: Request, stale: bool) -> bool:
    """Sync: whether the step whose output is being delivered (the oldest in flight) reached the request's last
    known token, i.e. sampled rather than computed part of a prefill. Its tokens end where the later steps in
    flight begin; of the steps in flight when it was preempted, only the last can have sampled."""
    if stale:
        return req.stale_output_samples and not req.num_stale_output_tokens
    return req.num_computed_tokens - req.num_in_flight_tokens >= req.num_tokens
