"""Scheduler: token-level, iteration-level scheduling as in vLLM V1, and the three modes the engine compares it to.

The rules it follows are written out in docs/scheduling.md. The scheduler owns the requests, its queues and the
step's token budget, and works with three collaborators, each in its own module:
- the batching mode (refengine/scheduler/batching.py) runs the two passes in its order: the running requests
  (`_schedule_running`: each gets min(tokens left, long_prefill_token_threshold, budget)) and the waiting ones
  (`_schedule_waiting`: admitted only when blocks for the whole prompt can be had);
- the preemption policy (refengine/scheduler/preemption.py) names the victim when a block cannot be had and preempts it
  (swap or recompute, back to the front of the waiting queue); `_preempt` gives its tokens back to the budget;
- the update step (refengine/scheduler/scheduler_update.py) advances `num_computed_tokens` at the end of schedule(), and in
  update_from_output() appends the sampled tokens and finishes the requests the stop checks end (`finish`, which
  aborts use too).
Only the scheduler and these collaborators set `Request.status`.

Async scheduling (vLLM's AsyncScheduler) and its output placeholders: refengine/scheduler/scheduler_update.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from refengine.config import SchedulerConfig, SchedulingPolicy
from refengine.kv_cache.kv_cache_manager import KVCacheManager
from refengine.limits import max_kv_tokens
from refengine.request import Request, RequestStatus
from refengine.scheduler.batching import make_batching
from refengine.scheduler.preemption import PreemptionPolicy
from refengine.scheduler.request_queue import create_request_queue
from refengine.scheduler.scheduler_invariants import check_scheduler_invariants
from refengine.scheduler.scheduler_output import SchedulerOutput
from refengine.scheduler.scheduler_stats import SchedulerStats, scheduler_stats
from refengine.scheduler.scheduler_update import SchedulerUpdate


class Scheduler:
    def __init__(
        self, config: SchedulerConfig | None = None, *, eos_token_id: int | Sequence[int] | None = None, **knobs: object
    ) -> None:
        """`Scheduler(config)` with a SchedulerConfig, or `Scheduler(**knobs)` with its fields by keyword."""
        self.config = c = SchedulerConfig.of(config, knobs)
        self.eos_token_id = eos_token_id
        self.batching = make_batching(c)
        self.kv_cache_manager = KVCacheManager(
            c.num_gpu_blocks, c.block_size, c.enable_prefix_caching, c.num_cpu_blocks
        )
        self.waiting = create_request_queue(c.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.preemption = PreemptionPolicy(c, self.kv_cache_manager, self.batching.reserves_full_length)
        self.update_step = SchedulerUpdate(c, self.kv_cache_manager, self.requests, self.waiting)
        self.num_steps = 0
        self.num_prefix_cache_queries = 0  # tokens of admitted requests (vLLM's PrefixCacheStats.queries)
        self.num_prefix_cache_hits = 0  # of those, tokens found in the prefix cache
        # every timestamp the scheduler sets; the engine swaps in its clock (a virtual one on a simulated GPU)
        self.clock: Callable[[], float] = time.monotonic

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
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
            self.update_step.finish(req, status, self.clock())

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks

    @property
    def num_preemptions(self) -> int:
        return self.preemption.num_preemptions

    @property
    def num_swap_outs(self) -> int:
        """The preemptions that went to the host pool rather than recompute."""
        return self.preemption.num_swap_outs

    # ---- schedule -------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = self._begin_step()
        self.batching.step(self, out)
        self._end_step(out)
        return out

    def _end_step(self, out: SchedulerOutput) -> None:
        self.update_step.after_schedule(out, self.clock())
        self.num_steps += 1
        self.kv_cache_manager.end_step()

    def _begin_step(self) -> SchedulerOutput:
        """Per-step state: the budget, the prefill cap."""
        out = SchedulerOutput(finished_req_ids=self.update_step.take_finished_req_ids())
        self._budget = self.config.max_num_batched_tokens
        # The long-prefill cap exists so that one prefill cannot starve the others; alone, a request has no one to
        # starve and uses the whole budget (as vLLM does).
        lone = len(self.running) + len(self.waiting) <= 1
        self._threshold = 0 if lone else self.config.long_prefill_token_threshold
        return out

    @staticmethod
    def _in_prefill(req: Request) -> bool:
        """True while tokens of the prompt (or, after recompute, of prompt + output) remain to be computed."""
        return req.num_computed_tokens < max(req.num_prompt_tokens, req.num_tokens - 1)

    def _num_new_tokens(self, req: Request, num_computed: int) -> int:
        n = req.num_tokens + req.num_output_placeholders - num_computed
        if 0 < self._threshold < n:
            n = self._threshold
        # the token at position max_model_len - 1 is the last one a request may hold: its KV is never needed
        return min(n, self.config.max_model_len - 1 - num_computed)

    def _tokens_to_fit(self, req: Request) -> int:
        """Tokens whose KV must be placeable for admission: the whole prompt (+ generated tokens), or the whole
        request up to max_tokens in the modes that reserve at admission."""
        if self.batching.reserves_full_length:
            return max_kv_tokens(req.num_prompt_tokens, req.max_tokens, self.config.max_model_len)
        return req.num_tokens

    def _schedule_running(self, out: SchedulerOutput, prefill_only: bool = False) -> None:
        """Running requests in admission order; `prefill_only` (sequence mode) skips those that would decode.
        This loop runs for every running request every step, so _num_new_tokens, _in_prefill and _schedule are
        inlined here (the same rules, kept in step by refengine/tests/test_hot_loop.py; `cbbench bench-scheduler`
        measured the calls at ~140 us per step at 256 running), and the KV manager is asked for slots only when the request may need a block or
        has one to cache (`has_room`)."""
        kv, c = self.kv_cache_manager, self.config
        running, scheduled, is_prefill = self.running, out.num_scheduled_tokens, out.is_prefill
        threshold, last_pos, chunked = self._threshold, c.max_model_len - 1, c.enable_chunked_prefill
        budget, priority = self._budget, self.preemption.policy is SchedulingPolicy.PRIORITY
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
                self._budget = budget
                while kv.allocate_slots(req, n) is None:
                    victim = self.preemption.pick_victim(running)
                    if running.index(victim) < i:
                        i -= 1  # (priority policy) an earlier, already scheduled request gave way
                    self._preempt(victim, out)
                    if victim is req:
                        break
                budget = self._budget  # (a preempted victim that was scheduled gave its tokens back)
                if req.status != RequestStatus.RUNNING:
                    if priority:
                        continue  # it was the least urgent: the (more urgent) ones after it may still fit
                    break  # FCFS: it was the last admitted, so nobody follows it
            scheduled[req.request_id] = n
            is_prefill[req.request_id] = in_prefill
            budget -= n
            i += 1
        self._budget = budget

    def _schedule_waiting(self, out: SchedulerOutput, admit_without_budget: bool = False) -> None:
        skipped: list[Request] = []
        try:
            self._admit_waiting(out, admit_without_budget, skipped)
        finally:  # requests passed over this step go back to the front, in their order (vLLM's skip_request)
            for req in reversed(skipped):
                self.waiting.prepend(req)

    def _admit_waiting(self, out: SchedulerOutput, admit_without_budget: bool, skipped: list[Request]) -> None:
        kv, c, mode = self.kv_cache_manager, self.config, self.batching
        max_seqs, reserve = mode.max_num_seqs, mode.reserves_full_length
        while self.waiting and (self._budget > 0 or admit_without_budget):
            req = self.waiting.peek()
            if req.num_stale_output_tokens:
                # async: preempted with a step in flight; resuming now could resample the position that step's
                # output is about to deliver. It drains by the next step.
                skipped.append(self.waiting.pop())
                continue
            if len(self.running) >= max_seqs:
                if self._preempt_for(req, out):
                    continue
                break
            swapped = req.request_id in kv.swapped
            hits, num_computed = ([], req.num_computed_tokens) if swapped else kv.get_computed_blocks(req)
            n = self._num_new_tokens(req, num_computed)
            if not c.enable_chunked_prefill and n > self._budget:
                if not admit_without_budget:
                    break  # head of line: the whole prompt must go in one step
                n = 0  # static batch member: joins now, prefills in a later step of the same batch
            n = min(n, self._budget)
            fit = self._tokens_to_fit(req)
            if swapped:
                plan = kv.swap_in(req, n, fit, reserve)
                ok = plan is not None
                out.blocks_to_swap_in.extend(plan or ())
            else:
                ok = kv.allocate_slots(req, n, hits, fit, reserve) is not None
            if not ok:
                if self._preempt_for(req, out):
                    continue
                break
            self.waiting.pop()
            if not swapped:
                if req.status == RequestStatus.PREEMPTED:
                    req.num_recomputed_tokens += max(0, req.num_lost_tokens - num_computed)
                req.num_computed_tokens = num_computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = num_computed
                self.num_prefix_cache_queries += req.num_tokens
                self.num_prefix_cache_hits += num_computed
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            mode.on_admit(req.request_id)
            if n > 0:
                self._schedule(out, req, n)

    def _schedule(self, out: SchedulerOutput, req: Request, n: int) -> None:
        out.num_scheduled_tokens[req.request_id] = n
        # (inline _in_prefill: this runs for every request every step)
        out.is_prefill[req.request_id] = req.num_computed_tokens < max(req.num_prompt_tokens, req.num_tokens - 1)
        self._budget -= n

    # ---- preemption -----------------------------------------------------------------------------------------
    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        """Preempt the policy's victim `req` (refengine/scheduler/preemption.py); its tokens of this step go back to the budget."""
        self._budget += self.preemption.preempt(req, out, self.running, self.waiting)

    def _preempt_for(self, req: Request, out: SchedulerOutput) -> bool:
        """Beyond vLLM (priority_preemption): preempt the running request that waiting `req` outranks, if any."""
        victim = self.preemption.victim_to_admit(req, self.running)
        if victim is None:
            return False
        self._preempt(victim, out)
        return True

    # ---- outputs --------------------------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, sampled_token_ids: dict[str, list[int]]) -> list[Request]:
        """Append each request's sampled tokens (a partial prefill samples nothing) and finish those that hit
        EOS, a stop token id or their length limit (refengine/scheduler/scheduler_update.py). Returns the requests finished
        by this call. Under async scheduling `out` is the oldest step whose output has not come back yet."""
        finished = self.update_step.update_from_output(out, sampled_token_ids, self.clock)
        if finished:
            self.running = [r for r in self.running if r.status == RequestStatus.RUNNING]
        return finished

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
        return scheduler_stats(self, scheduler_output)

    # ---- self-check -----------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The state every step must leave behind; the conformance suite calls this after every step."""
        check_scheduler_invariants(self.config, self.kv_cache_manager, self.batching, self.running, self.waiting)
