"""Scheduler: token-level, iteration-level scheduling as in vLLM V1, and the three modes the engine compares it to.

The rules it follows are written out in docs/scheduling.md. One schedule() call asks the batching mode object
(refengine/batching.py) to run the two passes in its order: the running requests (`_schedule_running`: each gets
min(tokens left, long_prefill_token_threshold, budget), preempting the policy's victim when a block cannot be had,
as refengine/scheduler_preemption.py does) and the waiting ones (`_schedule_waiting`: admitted only when blocks for
the whole prompt can be had).
`num_computed_tokens` advances at the end of schedule(); update_from_output() (refengine/scheduler_update.py)
appends the sampled tokens and finishes requests. Only the scheduler sets `Request.status`.

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

from refengine.batching import make_batching
from refengine.block_pool import KVCacheBlock
from refengine.config import SchedulerConfig, SchedulingPolicy
from refengine.kv_cache_manager import KVCacheManager
from refengine.limits import max_kv_tokens
from refengine.request import Request, RequestStatus
from refengine.request_queue import create_request_queue
from refengine.scheduler_invariants import check_scheduler_invariants
from refengine.scheduler_output import CachedRequestData, ModelRunnerOutput, NewRequestData, RunnerView, SchedulerOutput  # noqa: F401  (re-exported: the contract's names, as vLLM's)
from refengine.scheduler_preemption import SchedulerPreemption


class Scheduler(SchedulerPreemption):
    def __init__(
        self, config: SchedulerConfig | None = None, *, eos_token_id: int | Sequence[int] | None = None, **knobs: object
    ) -> None:
        """`Scheduler(config)` with a SchedulerConfig, or `Scheduler(**knobs)` with its fields by keyword."""
        if config is not None and knobs:
            raise ValueError("give the scheduler either a SchedulerConfig or its fields by keyword, not both")
        if config is None:
            unknown = set(knobs) - set(SchedulerConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown scheduler option(s): {sorted(unknown)}")
            config = SchedulerConfig(**knobs)  # type: ignore[arg-type]
        elif not isinstance(config, SchedulerConfig):
            raise ValueError(f"config must be a SchedulerConfig, got {type(config).__name__}")
        self.config = c = config
        self.eos_token_id = eos_token_id
        self.batching = make_batching(c)
        self.policy = SchedulingPolicy(c.policy)
        self.kv_cache_manager = KVCacheManager(
            c.num_gpu_blocks, c.block_size, c.enable_prefix_caching, c.num_cpu_blocks
        )
        self.waiting = create_request_queue(c.policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.finished_req_ids: set[str] = set()
        self._host_blocks_to_free: list[list[KVCacheBlock]] = []  # swap-in sources of this schedule(), freed after
        self.num_preemptions = 0
        self.num_swap_outs = 0  # preemptions that went to the host pool rather than recompute
        self.num_steps = 0
        self.num_prefix_cache_queries = 0  # tokens of admitted requests (vLLM's PrefixCacheStats.queries)
        self.num_prefix_cache_hits = 0  # of those, tokens found in the prefix cache
        self.runner_view = RunnerView()  # what the model runner has been told (builds each output's request data)
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
            self._finish(req, status)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def num_free_blocks(self) -> int:
        return self.kv_cache_manager.num_free_blocks

    # ---- schedule -------------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = self._begin_step()
        self.batching.step(self, out)
        self._update_after_schedule(out)
        self._free_swapped_in_host_blocks()
        return out

    def _free_swapped_in_host_blocks(self) -> None:
        """The host blocks this step swaps in from go back to the host pool as schedule() returns, not a step later:
        held until the next schedule(), they stayed held for good once the engine went idle. Not earlier: a victim
        preempted later in the same schedule() could be swapped out into them, and the runner issues a step's
        swap-out copies before its swap-in copies. A later step's swap-out is copied after this step's swap-in,
        because the runner executes steps in order (async scheduling too: one worker thread)."""
        for host in self._host_blocks_to_free:
            self.kv_cache_manager.host_pool.free_blocks(reversed(host))
        self._host_blocks_to_free = []

    def _begin_step(self) -> SchedulerOutput:
        """Per-step state: the budget, the prefill cap."""
        out = SchedulerOutput(finished_req_ids=self.finished_req_ids)
        self.finished_req_ids = set()
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
        budget, priority = self._budget, self.policy is SchedulingPolicy.PRIORITY
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
                    victim = self._pick_victim()
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
                res = kv.swap_in(req, n, fit, reserve)
                ok = res is not None
                if res is not None:  # (ok, narrowed for the type checker)
                    out.blocks_to_swap_in.extend(res[0])
                    self._host_blocks_to_free.append(res[1])
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

    # ---- self-check -----------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """The state every step must leave behind; the conformance suite calls this after every step."""
        check_scheduler_invariants(self)
